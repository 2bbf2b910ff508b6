"""Packed linears on the CPU: both kernels give F.linear's results, the
plain weights are freed, and the layers route through them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pagoda.kernels import cpu as cpu_kernels
from pagoda.runtime.layers import packed_linear
from pagoda.runtime.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from pagoda.runtime.layers.linear import ReplicatedLinear, RowParallelLinear
from torch import nn

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(
    not packed_linear.available(torch.float32, CPU), reason="no packed linear kernel here"
)


def kernels(dtype):
    """The kernels that run `dtype` on this machine."""
    found = []
    if cpu_kernels.linear_ops(dtype) is not None:
        found.append("pagoda")
    if packed_linear.onednn_available(dtype):
        found.append("onednn")
    return found


@pytest.mark.parametrize("rows", [1, 5, 16, 300])
def test_onednn_bf16_gives_the_bits_of_f_linear(rows):
    if "onednn" not in kernels(torch.bfloat16):
        pytest.skip("no native bf16 oneDNN on this CPU")
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=gen).bfloat16()
    x = torch.randn(rows, 64, generator=gen).bfloat16()
    packed = packed_linear.pack(w, 16, kernel="onednn")
    assert torch.equal(packed_linear.linear(x, packed, None), F.linear(x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 16, 300])
def test_every_kernel_matches_f_linear_with_bias(dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 64, generator=gen)
    w, b, x = w.to(dtype), b.to(dtype), x.to(dtype)
    expected = F.linear(x.float(), w.float(), b.float())
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    if not kernels(dtype):
        pytest.skip(f"no packed {dtype} kernel here")
    for kernel in kernels(dtype):
        packed = packed_linear.pack(w, 16, kernel=kernel)
        assert packed.kernel == kernel and packed.out_features == 96
        got = packed_linear.linear(x, packed, b)
        assert got.dtype == dtype and got.shape == (rows, 96)
        torch.testing.assert_close(got.float(), expected, **tol)


def test_the_default_is_pagoda_where_it_runs():
    packed = packed_linear.pack(torch.randn(64, 32), 16)
    assert packed.kernel == ("pagoda" if "pagoda" in kernels(torch.float32) else "onednn")


def test_inputs_of_any_rank_and_strides():
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(80, 48, generator=gen)
    packed = packed_linear.pack(w, 16)
    x = torch.randn(2, 3, 48, generator=gen)
    torch.testing.assert_close(packed_linear.linear(x, packed, None), F.linear(x, w))
    columns = torch.randn(48, 6, generator=gen).T  # rows not contiguous
    torch.testing.assert_close(packed_linear.linear(columns, packed, None), F.linear(columns, w))


def test_pack_model_packs_linears_and_lm_head_and_frees_linear_weights():
    model = nn.Module()
    model.proj = ReplicatedLinear(64, 96, bias=True)
    model.down = RowParallelLinear(96, 64)
    model.embed = VocabParallelEmbedding(128, 64)
    model.head = ParallelLMHead(128, 64)
    model.head.tie_to(model.embed)
    gen = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(5, 64, generator=gen)
    expected = (model.down(model.proj(x)), model.head.compute_logits(x))

    assert packed_linear.pack_model(model, 16) == 3
    assert model.proj.weight.numel() == 0 and model.down.weight.numel() == 0
    assert model.embed.weight.shape == (128, 64)  # shared with the tied head: kept
    # float32: the packed kernels sum in another order than MKL's sgemm;
    # two stacked layers of outputs ~10-100 differ at rounding level.
    torch.testing.assert_close(model.down(model.proj(x)), expected[0], rtol=2e-5, atol=1e-4)
    torch.testing.assert_close(model.head.compute_logits(x), expected[1], rtol=2e-5, atol=1e-4)


def test_pack_model_frees_an_untied_lm_heads_plain_weight():
    model = nn.Module()
    model.embed = VocabParallelEmbedding(128, 64)
    model.head = ParallelLMHead(128, 64)  # not tied: a weight of its own
    gen = torch.Generator().manual_seed(3)
    for p in model.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(5, 64, generator=gen)
    ids = torch.tensor([0, 5, 127])
    expected = (model.head.compute_logits(x), model.embed(ids))

    assert packed_linear.pack_model(model, 16) == 1
    assert model.head.weight.numel() == 0
    assert model.embed.weight.shape == (128, 64)
    torch.testing.assert_close(model.head.compute_logits(x), expected[0], rtol=2e-5, atol=1e-4)
    torch.testing.assert_close(model.embed(ids), expected[1])


def test_not_available_off_the_cpu_or_in_half_precision():
    assert not packed_linear.available(torch.float32, torch.device("cuda"))
    assert not packed_linear.available(torch.float16, CPU)
