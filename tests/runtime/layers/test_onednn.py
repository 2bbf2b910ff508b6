"""oneDNN-prepacked linears on the CPU: same results as F.linear, weights freed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pagoda.runtime.layers import onednn
from pagoda.runtime.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from pagoda.runtime.layers.linear import ReplicatedLinear, RowParallelLinear
from torch import nn

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(
    not onednn.available(torch.float32, CPU), reason="torch built without oneDNN"
)


@pytest.mark.parametrize("rows", [1, 5, 16, 300])
def test_packed_bf16_linear_gives_the_bits_of_f_linear(rows):
    if not onednn.available(torch.bfloat16, CPU):
        pytest.skip("no native bf16 on this CPU")
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=gen).bfloat16()
    x = torch.randn(rows, 64, generator=gen).bfloat16()
    assert torch.equal(onednn.linear(x, onednn.pack(w, 16), None), F.linear(x, w))


def test_packed_float32_linear_matches_f_linear_with_bias():
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(7, 64, generator=gen)
    torch.testing.assert_close(onednn.linear(x, onednn.pack(w, 16), b), F.linear(x, w, b))


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

    assert onednn.pack_model(model, 16) == 3
    assert model.proj.weight.numel() == 0 and model.down.weight.numel() == 0
    assert model.embed.weight.shape == (128, 64)  # shared with the tied head: kept
    # float32: oneDNN's kernel sums in another order than MKL's sgemm;
    # two stacked layers of outputs ~10-100 differ at rounding level.
    torch.testing.assert_close(model.down(model.proj(x)), expected[0], rtol=2e-5, atol=1e-4)
    torch.testing.assert_close(model.head.compute_logits(x), expected[1], rtol=2e-5, atol=1e-4)


def test_not_available_off_the_cpu_or_in_half_precision():
    assert not onednn.available(torch.float32, torch.device("cuda"))
    assert not onednn.available(torch.float16, CPU)
