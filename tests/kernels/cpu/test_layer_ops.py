"""The C++ CPU RMSNorm (with and without the residual add) and RoPE give the
torch twins' results. RoPE and the residual sum: the same bits in bf16 and
fp16, where both round after every op. RMSNorm: the sum of squares is
accumulated in another order, which can move a result across a rounding
boundary: one unit in the last place of either rounding, on few elements."""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels import ops, reference
from pagoda.kernels.cpu import build
from pagoda.runtime.layers.rotary import RotaryEmbedding


@pytest.fixture(scope="module")
def ext():
    return build()


def assert_same(actual, expected, exact=True):
    if expected.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    elif exact:
        assert torch.equal(actual, expected), (actual - expected).abs().max()
    else:
        ulp = 2.0 ** -(7 if expected.dtype == torch.bfloat16 else 10)
        # Two roundings (the normalized value, then its product with the weight).
        torch.testing.assert_close(actual, expected, rtol=2 * ulp, atol=1e-6)
        assert (actual != expected).float().mean() < 0.01


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_rms_norm_matches_twin(ext, dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    x = (3 * torch.randn(rows, 576, generator=gen)).to(dtype)
    residual = torch.randn(rows, 576, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(576, generator=gen)).to(dtype)
    assert_same(ext.rms_norm(x, weight, 1e-5), reference.rms_norm_ref(x, weight, 1e-5), False)
    out, summed = ext.fused_add_rms_norm(x, residual, weight, 1e-5)
    ref_out, ref_sum = reference.rms_norm_ref(x, weight, 1e-5, residual)
    assert torch.equal(summed, ref_sum)
    assert_same(out, ref_out, exact=False)
    # The inputs are left alone (the twin returns new tensors too).
    assert torch.equal(ops.rms_norm(x, weight, 1e-5, residual, triton=False, cpu=True)[1], ref_sum)


def test_rms_norm_reads_strided_rows(ext):
    wide = torch.randn(5, 1000).to(torch.bfloat16)
    x = wide[:, 100:676]  # rows 1000 apart, as a slice of a fused output
    weight = torch.ones(576, dtype=torch.bfloat16)
    assert_same(ext.rms_norm(x, weight, 1e-6), reference.rms_norm_ref(x, weight, 1e-6), False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "head_size,rot_dim,scaling",
    [
        (64, 64, None),
        (
            128,
            128,
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
        (80, 40, None),
    ],
)
def test_rotary_matches_twin_on_views_of_a_fused_output(ext, dtype, head_size, rot_dim, scaling):
    gen = torch.Generator().manual_seed(head_size)
    rope = RotaryEmbedding(rot_dim, 4096, 10000.0, scaling)
    tokens, num_heads, num_kv_heads = 23, 9, 3
    q_size, kv_size = num_heads * head_size, num_kv_heads * head_size
    qkv = torch.randn(tokens, q_size + 2 * kv_size, generator=gen).to(dtype)
    positions = torch.randint(0, 4096, (tokens,), generator=gen)
    expected = qkv.clone()

    def views(t):
        q, k, _ = t.split([q_size, kv_size, kv_size], dim=-1)
        return q.view(tokens, num_heads, head_size), k.view(tokens, num_kv_heads, head_size)

    # Partial rotary: the cache covers rot_dim of each head, the rest passes.
    reference.rotary_embedding_ref(positions, *views(expected), rope.cos_sin_cache)
    ext.rotary_embedding(positions, *views(qkv), rope.cos_sin_cache)
    assert_same(qkv, expected)


def test_refuses_what_it_cannot_read(ext):
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="weight"):
        ext.rms_norm(x, torch.ones(7), 1e-6)
    with pytest.raises(RuntimeError, match="contiguous rows"):
        ext.rms_norm(x.t(), torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError, match="residual"):
        ext.fused_add_rms_norm(x, torch.randn(3, 8), torch.ones(8), 1e-6)
    q, k = torch.randn(2, 2, 8), torch.randn(2, 1, 8)
    cache = torch.randn(16, 8)
    with pytest.raises(RuntimeError, match="outside the cache"):
        ext.rotary_embedding(torch.tensor([0, 16]), q, k, cache)
    with pytest.raises(RuntimeError, match="one position per token"):
        ext.rotary_embedding(torch.tensor([0]), q, k, cache)
    with pytest.raises(RuntimeError, match="float32"):
        ext.rotary_embedding(torch.tensor([0, 1]), q, k, cache.double())
    with pytest.raises(RuntimeError, match="2 \\* d"):
        ext.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(
        RuntimeError, match="x dtype must be float32, bfloat16 or float16, got Double"
    ):
        ext.rms_norm(x.double(), torch.ones(8, dtype=torch.float64), 1e-6)
    with pytest.raises(RuntimeError, match=r"query/key dtype must be .*, got Int"):
        ext.rotary_embedding(torch.tensor([0, 1]), q.int(), k.int(), cache)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "d"), [(1, 1536), (5, 40), (33, 1537)])
def test_silu_and_mul_matches_twin(ext, dtype, rows, d):
    # Gates over the sigmoid's whole range, the overflow-prone tails included
    # (e^-g of a gate of -100 is past float32: the kernel never computes it).
    gen = torch.Generator().manual_seed(d)
    gate = torch.cat(
        [
            8 * torch.randn(rows, d - 4, generator=gen),
            torch.tensor([[-100.0, -20.0, 20.0, 100.0]] * rows),
        ],
        1,
    )
    x = torch.cat([gate, torch.randn(rows, d, generator=gen)], 1).to(dtype)
    got = ext.silu_and_mul(x)
    assert got.shape == (rows, d) and got.dtype == dtype
    assert_same(got, reference.silu_and_mul_ref(x), exact=False)
    assert torch.equal(ops.silu_and_mul(x, triton=False, cpu=True), got)


def test_silu_and_mul_reads_strided_rows(ext):
    wide = torch.randn(3, 100).bfloat16()
    x = wide[:, 10:90]  # rows 100 apart
    assert_same(ext.silu_and_mul(x), reference.silu_and_mul_ref(x), exact=False)
