"""RMSNorm, alone and with the residual add fused in, against its formula."""

import pytest
import torch
from pagoda.runtime.layers.layernorm import RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

EPS = 1e-5


def formula(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return weight.double() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


@pytest.fixture
def norm() -> RMSNorm:
    gen = torch.Generator().manual_seed(0)
    layer = RMSNorm(48, EPS)
    layer.weight.data = 1 + 0.5 * torch.randn(48, generator=gen)
    return layer


def test_rmsnorm_without_residual_is_the_formula(norm):
    x = 3 * torch.randn(7, 48, generator=torch.Generator().manual_seed(1))
    out = norm(x)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out.double(), formula(x, norm.weight), rtol=1e-6, atol=1e-6)


def test_rmsnorm_with_residual_normalizes_the_sum_and_returns_it(norm):
    gen = torch.Generator().manual_seed(2)
    x, residual = torch.randn(7, 48, generator=gen), torch.randn(7, 48, generator=gen)
    out, new_residual = norm(x, residual)
    torch.testing.assert_close(new_residual, x + residual, rtol=0, atol=0)
    expected = formula(x + residual, norm.weight)
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_equals_transformers_in_its_dtype(norm, dtype):
    ref = LlamaRMSNorm(48, eps=EPS)
    ref.weight.data = norm.weight.data.clone()
    norm, ref = norm.to(dtype), ref.to(dtype)
    x = torch.randn(5, 48, generator=torch.Generator().manual_seed(3)).to(dtype)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), ref(x), rtol=0, atol=0)
