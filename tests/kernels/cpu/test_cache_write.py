"""The C++ CPU cache write against the torch twin: rows land at their slots
(padding slots skipped), strided K/V views are read, and a bad slot is
refused before anything is written."""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels import reference
from pagoda.kernels.cpu import build


@pytest.fixture(scope="module")
def op():
    return build().reshape_and_cache


def fused_kv(tokens, heads, head_size, dtype, seed=0):
    """K and V as views of one fused qkv output, as the model hands them over."""
    gen = torch.Generator().manual_seed(seed)
    q_width = 3 * heads * head_size
    qkv = torch.randn(tokens, q_width + 2 * heads * head_size, generator=gen).to(dtype)
    k = qkv[:, q_width : q_width + heads * head_size].view(tokens, heads, head_size)
    v = qkv[:, q_width + heads * head_size :].view(tokens, heads, head_size)
    return k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_the_twin_and_skips_padding(op, dtype):
    k, v = fused_kv(7, 3, 64, dtype)
    slots = torch.tensor([17, 3, -1, 40, 0, -1, 63], dtype=torch.long)
    cache = torch.zeros(2, 4, 16, 3, 64, dtype=dtype)
    expected = cache.clone()
    reference.reshape_and_cache_ref(k, v, expected, slots)
    op(k, v, cache, slots)
    assert torch.equal(cache, expected)
    assert cache[0].reshape(64, -1).count_nonzero(dim=1).gt(0).sum() == 5


@pytest.mark.parametrize(
    "dtype, cache_dtype",
    [
        (torch.float32, torch.float16),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.float32),
    ],
)
def test_a_cache_in_another_dtype_gets_rows_rounded_as_torch_rounds(op, dtype, cache_dtype):
    k, v = fused_kv(7, 3, 64, dtype)
    k[0, 0, :3] = torch.tensor([1e6, -1e-9, float("nan")])  # past fp16's range, subnormal, NaN
    slots = torch.tensor([17, 3, -1, 40, 0, -1, 63], dtype=torch.long)
    cache = torch.zeros(2, 4, 16, 3, 64, dtype=cache_dtype)
    expected = cache.clone()
    reference.reshape_and_cache_ref(k, v, expected, slots)
    op(k, v, cache, slots)
    torch.testing.assert_close(cache, expected, rtol=0, atol=0, equal_nan=True)


def test_reads_only_one_slot_per_token(op):
    k, v = fused_kv(2, 1, 8, torch.float32)
    slots = torch.tensor([5, 9, 1000], dtype=torch.long)  # longer than the tokens, as padded
    cache = torch.zeros(2, 1, 16, 1, 8)
    op(k, v, cache, slots)
    assert torch.equal(cache[0, 0, 5, 0], k[0, 0]) and torch.equal(cache[1, 0, 9, 0], v[1, 0])


def test_refuses_bad_input_and_writes_nothing(op):
    k, v = fused_kv(3, 2, 8, torch.float32)
    cache = torch.zeros(2, 2, 4, 2, 8)
    with pytest.raises(RuntimeError, match="outside the cache"):
        op(k, v, cache, torch.tensor([0, 1, 8]))
    assert cache.count_nonzero() == 0  # the good slots before the bad one too
    with pytest.raises(RuntimeError, match="int64"):
        op(k, v, cache, torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="key/value dtype must be"):
        op(k.double(), v.double(), cache, torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="kv_cache dtype must be"):
        op(k, v, cache.double(), torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="dtypes differ"):
        op(k, v.half(), cache, torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="kv_heads"):
        op(k[:, :1], v[:, :1], cache, torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="slot per token"):
        op(k, v, cache, torch.tensor([0, 1]))
