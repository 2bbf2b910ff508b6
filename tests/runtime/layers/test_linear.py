"""Fused projections load each checkpoint tensor into the slice where the
unfused projection's output lands, on one rank and split over ranks."""

import pytest
import torch
import torch.nn.functional as F
from pagoda.runtime.distributed.parallel_state import TensorParallelGroup
from pagoda.runtime.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)

HIDDEN, HEAD = 24, 4


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_same_output(out: torch.Tensor, expected: torch.Tensor) -> None:
    # Equal up to matmul rounding: a different output width changes the
    # blocking, not the math; a misplaced shard is off by O(1).
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def load(layer, shard_id, weight, bias=None):
    layer.weight.weight_loader(layer.weight, weight, shard_id)
    if bias is not None:
        layer.bias.weight_loader(layer.bias, bias, shard_id)


@pytest.mark.parametrize("kv_heads", [6, 2, 1])  # MHA, GQA 3, MQA
def test_qkv_fused_output_is_q_k_v_concatenated(kv_heads):
    heads = 6
    w = {
        s: randn(n * HEAD, HIDDEN, seed=i)
        for i, (s, n) in enumerate([("q", heads), ("k", kv_heads), ("v", kv_heads)])
    }
    b = {s: randn(t.shape[0], seed=10 + i) for i, (s, t) in enumerate(w.items())}
    layer = QKVParallelLinear(HIDDEN, HEAD, heads, kv_heads, bias=True)
    for shard in ("v", "q", "k"):  # any order
        load(layer, shard, w[shard], b[shard])
    x = randn(5, HIDDEN, seed=99)
    expected = torch.cat([F.linear(x, w[s], b[s]) for s in ("q", "k", "v")], dim=-1)
    assert_same_output(layer(x), expected)


@pytest.mark.parametrize(("heads", "kv_heads", "tp_size"), [(4, 2, 2), (4, 1, 2), (6, 2, 2)])
def test_qkv_split_over_ranks_gives_each_rank_its_heads(heads, kv_heads, tp_size):
    wq, wk, wv = (
        randn(heads * HEAD, HIDDEN),
        randn(kv_heads * HEAD, HIDDEN, seed=1),
        randn(kv_heads * HEAD, HIDDEN, seed=2),
    )
    x = randn(3, HIDDEN, seed=3)
    q, k, v = F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)
    q_per, kv_per = heads // tp_size, max(1, kv_heads // tp_size)
    for rank in range(tp_size):
        layer = QKVParallelLinear(
            HIDDEN, HEAD, heads, kv_heads, tp=TensorParallelGroup(rank, tp_size)
        )
        for shard, w in (("q", wq), ("k", wk), ("v", wv)):
            load(layer, shard, w)
        # KV heads fewer than ranks are replicated: rank r reads KV head
        # r // (tp_size // kv_heads), the one its query heads attend to.
        kv_head = rank * kv_heads // tp_size if kv_heads < tp_size else rank * kv_per
        qs = slice(rank * q_per * HEAD, (rank + 1) * q_per * HEAD)
        kvs = slice(kv_head * HEAD, (kv_head + kv_per) * HEAD)
        expected = torch.cat([q[:, qs], k[:, kvs], v[:, kvs]], dim=-1)
        assert_same_output(layer(x), expected)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_gate_up_fused_output_is_gate_then_up(tp_size):
    inter = 10
    gate, up = randn(inter, HIDDEN), randn(inter, HIDDEN, seed=1)
    x = randn(4, HIDDEN, seed=2)
    per = inter // tp_size
    for rank in range(tp_size):
        layer = MergedColumnParallelLinear(
            HIDDEN, [inter, inter], tp=TensorParallelGroup(rank, tp_size)
        )
        load(layer, 1, up)
        load(layer, 0, gate)
        rows = slice(rank * per, (rank + 1) * per)
        expected = torch.cat([F.linear(x, gate[rows]), F.linear(x, up[rows])], dim=-1)
        assert_same_output(layer(x), expected)


def test_row_parallel_ranks_take_their_input_columns():
    w = randn(HIDDEN, 8)
    for rank in range(2):
        layer = RowParallelLinear(8, HIDDEN, tp=TensorParallelGroup(rank, 2))
        load(layer, None, w)
        torch.testing.assert_close(layer.weight, w[:, rank * 4 : (rank + 1) * 4], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("shard", "rows"), [("q", 4 * HEAD + 1), ("k", 2 * HEAD - HEAD), ("v", 3 * HEAD)]
)
def test_qkv_part_of_the_wrong_size_is_rejected(shard, rows):
    layer = QKVParallelLinear(HIDDEN, HEAD, 4, 2)
    with pytest.raises(ValueError, match="shape mismatch"):
        load(layer, shard, randn(rows, HIDDEN))


def test_gate_up_part_of_the_wrong_size_is_rejected():
    layer = MergedColumnParallelLinear(HIDDEN, [10, 10])
    with pytest.raises(ValueError, match="shape mismatch"):
        load(layer, 0, randn(12, HIDDEN))
    with pytest.raises(ValueError, match="shape mismatch"):
        load(layer, 1, randn(10, HIDDEN + 1))
