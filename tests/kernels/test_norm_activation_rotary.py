"""RMSNorm (with and without the fused residual add), SiLU-and-mul and RoPE
against their torch twins."""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels import reference
from pagoda.kernels.ops import rms_norm, rotary_embedding, silu_and_mul

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _poison_check(out: torch.Tensor) -> None:
    assert not out.isnan().any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [576, 1000])  # SmolLM2's width; a non-power of two
def test_rms_norm_matches_twin(dtype, hidden, rel_err, tolerance, device):
    torch.manual_seed(hidden + len(str(dtype)))
    x = torch.randn(7, hidden).to(device, dtype)
    w = (1 + 0.1 * torch.randn(hidden)).to(device, dtype)
    out = rms_norm(x, w, 1e-5)
    _poison_check(out)
    assert out.shape == x.shape and out.dtype == dtype
    assert rel_err(out, reference.rms_norm_ref(x, w, 1e-5)) < tolerance[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_returns_normed_sum_and_sum(dtype, rel_err, tolerance, device):
    torch.manual_seed(21)
    x = torch.randn(2, 5, 576).to(device, dtype)
    res = torch.randn(2, 5, 576).to(device, dtype)
    w = torch.randn(576).to(device, dtype)
    out, new_res = rms_norm(x, w, 1e-6, residual=res)
    ref_out, ref_res = reference.rms_norm_ref(x, w, 1e-6, residual=res)
    _poison_check(out)
    # One rounding of the sum, like the twin. (Not bit-exact in bf16: the
    # interpreter's float32 -> bf16 cast does not round ties to even.)
    assert rel_err(new_res, ref_res) < tolerance[dtype] / 2
    assert rel_err(out, ref_out) < tolerance[dtype]
    # Inputs are not modified.
    assert not torch.equal(new_res, res)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [1536, 300])
def test_silu_and_mul_matches_twin(dtype, d, rel_err, tolerance, device):
    torch.manual_seed(d + 3)
    x = (2 * torch.randn(6, 2 * d)).to(device, dtype)
    out = silu_and_mul(x)
    _poison_check(out)
    assert out.shape == (6, d)
    assert rel_err(out, reference.silu_and_mul_ref(x)) < tolerance[dtype]


def _cos_sin_cache(max_pos: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("head_size", "rot_dim"), [(64, 64), (128, 128), (64, 32)])
def test_rotary_in_place_matches_twin(dtype, head_size, rot_dim, rel_err, tolerance, device):
    torch.manual_seed(head_size + rot_dim)
    num_tokens, heads, kv_heads = 9, 6, 2
    # Q and K as views of one fused QKV output, as the model produces them.
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_size).to(device, dtype)
    q, k, _ = qkv.split([heads * head_size, kv_heads * head_size, kv_heads * head_size], -1)
    q, k = q.view(num_tokens, heads, head_size), k.view(num_tokens, kv_heads, head_size)
    positions = torch.randint(0, 500, (num_tokens,)).to(device)
    cache = _cos_sin_cache(512, rot_dim).to(device)
    q_ref, k_ref = q.clone(), k.clone()
    reference.rotary_embedding_ref(positions, q_ref, k_ref, cache)
    rotary_embedding(positions, q, k, cache)
    _poison_check(qkv)
    assert rel_err(q, q_ref) < tolerance[dtype]
    assert rel_err(k, k_ref) < tolerance[dtype]
    # Dims past rot_dim pass through untouched.
    assert torch.equal(q[..., rot_dim:], q_ref[..., rot_dim:])


def test_rotary_kernel_matches_transformers_rotate_half(device):
    torch.manual_seed(5)
    q, k = torch.randn(4, 3, 64, device=device), torch.randn(4, 1, 64, device=device)
    positions = torch.tensor([0, 1, 7, 100], device=device)
    cache = _cos_sin_cache(128, 64).to(device)
    half = cache.shape[-1] // 2
    cos = torch.cat([cache[positions, :half]] * 2, -1)[:, None]
    sin = torch.cat([cache[positions, half:]] * 2, -1)[:, None]

    def rotate_half(x):
        return torch.cat((-x[..., 32:], x[..., :32]), -1)

    expected_q = q * cos + rotate_half(q) * sin
    rotary_embedding(positions, q.view(4, -1), k.view(4, -1), cache, head_size=64)
    assert torch.allclose(q, expected_q, atol=1e-6)
