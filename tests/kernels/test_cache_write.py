"""Cache write against its torch twin: every new token lands at its slot,
nothing else in the cache changes."""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels import reference
from pagoda.kernels.ops import reshape_and_cache


@pytest.mark.parametrize(
    ("dtype", "num_kv_heads", "head_size", "block_size"),
    [
        (torch.float32, 2, 64, 16),
        (torch.bfloat16, 3, 64, 32),
        (torch.float16, 1, 128, 16),
        (torch.float32, 4, 96, 32),
    ],
)
def test_scatter_matches_twin_at_scattered_slots(
    dtype, num_kv_heads, head_size, block_size, paged_batch
):
    batch = paged_batch(
        [(1, 37), (11, 29), (20, 20)],
        num_kv_heads=num_kv_heads,
        group=1,
        head_size=head_size,
        block_size=block_size,
        dtype=dtype,
        seed=num_kv_heads * 1000 + head_size,
    )
    slots = batch.metadata.slot_mapping
    expected = batch.kv_cache.clone()
    reference.reshape_and_cache_ref(batch.key, batch.value, expected, slots)
    reshape_and_cache(batch.key, batch.value, batch.kv_cache, slots)
    # NaN == NaN under equal_nan: untouched slots must stay poisoned.
    assert torch.equal(batch.kv_cache.isnan(), expected.isnan())
    assert torch.equal(batch.kv_cache.nan_to_num(), expected.nan_to_num())
    flat_k = batch.kv_cache[0].reshape(-1, num_kv_heads, head_size)
    assert torch.equal(flat_k[slots], batch.key)


@pytest.mark.parametrize(
    ("dtype", "cache_dtype"),
    [
        (torch.float32, torch.float16),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.bfloat16, torch.float16),
    ],
)
def test_a_cache_in_another_dtype_gets_rows_rounded_as_torch_rounds(dtype, cache_dtype, device):
    """kv_cache_dtype: the write converts, rounding to nearest even."""
    if device.type == "cpu" and cache_dtype == torch.bfloat16:
        pytest.skip("the Triton interpreter truncates to bf16 where CUDA rounds to nearest")
    torch.manual_seed(13)
    k = torch.randn(6, 2, 64).to(dtype)
    v = torch.randn(6, 2, 64).to(dtype)
    k[0, 0, :2] = torch.tensor([3e4, 1e-6])  # large, and subnormal in fp16
    k, v = k.to(device), v.to(device)
    cache = torch.zeros(2, 2, 16, 2, 64, dtype=cache_dtype, device=device)
    slots = torch.tensor([3, 17, -1, 0, 31, 8], device=device)
    expected = cache.clone()
    reference.reshape_and_cache_ref(k, v, expected, slots)
    reshape_and_cache(k, v, cache, slots)
    assert torch.equal(cache, expected)


def test_strided_key_value_views_of_a_fused_qkv(device):
    torch.manual_seed(11)
    num_tokens, heads, kv_heads, d, bs = 9, 4, 2, 64, 16
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * d).to(device)
    _, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    k, v = k.view(num_tokens, kv_heads, d), v.view(num_tokens, kv_heads, d)
    cache = torch.full((2, 4, bs, kv_heads, d), float("nan"), device=device)
    slots = torch.randperm(4 * bs)[:num_tokens].to(device)
    reshape_and_cache(k, v, cache, slots)
    assert torch.equal(cache[0].reshape(-1, kv_heads, d)[slots], k)
    assert torch.equal(cache[1].reshape(-1, kv_heads, d)[slots], v)


def test_padding_slots_are_skipped(device):
    torch.manual_seed(12)
    k, v = torch.randn(5, 2, 64, device=device), torch.randn(5, 2, 64, device=device)
    cache = torch.full((2, 2, 16, 2, 64), float("nan"), device=device)
    slots = torch.tensor([3, -1, 17, -1, 30], device=device)
    reshape_and_cache(k, v, cache, slots)
    written = cache[0].reshape(-1, 2, 64)
    assert torch.equal(written[slots[slots >= 0]], k[slots >= 0])
    assert (~written.isnan().all(dim=(1, 2))).sum() == 3
