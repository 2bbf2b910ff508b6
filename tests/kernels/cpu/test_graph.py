"""The CPU graph: every kernel call made while it captures is replayed on the
same tensors, reading their new contents; data-dependent checks still run
at replay; captures do not nest; and the token embedding kernel."""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels.cpu import build


@pytest.fixture(scope="module")
def ext():
    return build()


def block(ext, ids, positions, slots, table, lens, weights, cache):
    """One decoder layer's kernel calls, in the model's order."""
    emb, norm_w, qkv_w, o_w, cos_sin = weights
    hidden = ext.embedding(ids, emb)
    x = ext.rms_norm(hidden, norm_w, 1e-5)
    qkv = ext.packed_linear(x, qkv_w, 4 * 64, None)
    t = ids.shape[0]
    q = qkv[:, :128].view(t, 2, 64)
    k = qkv[:, 128:192].view(t, 1, 64)
    v = qkv[:, 192:].view(t, 1, 64)
    ext.rotary_embedding(positions, q, k, cos_sin)
    ext.reshape_and_cache(k, v, cache, slots)
    attn = torch.empty_like(q)
    ext.decode_attention(attn, q, cache, table, lens, torch.arange(t), 0.125)
    out = ext.packed_linear(attn.view(t, 128), o_w, 96, None)
    act = ext.silu_and_mul(out)
    return ext.fused_add_rms_norm(act, hidden[:, :48], norm_w[:48], 1e-5)


def make_inputs(gen, tokens, vocab, num_blocks):
    lens = torch.randint(1, 4 * 16 + 1, (tokens,), generator=gen)
    table = torch.randint(0, num_blocks, (tokens, 4), generator=gen)
    pos = lens - 1
    slots = table.gather(1, (pos // 16)[:, None]).squeeze(1) * 16 + pos % 16
    ids = torch.randint(0, vocab, (tokens,), generator=gen)
    return ids, pos, slots, table.to(torch.int32), lens.to(torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_replay_equals_an_eager_run_on_the_new_inputs(ext, dtype):
    if not ext.linear_supported(dtype):
        pytest.skip(f"no packed linear for {dtype} on this CPU")
    gen = torch.Generator().manual_seed(0)
    vocab, tokens, num_blocks = 50, 3, 8
    weights = (
        torch.randn(vocab, 96, generator=gen).to(dtype),
        torch.rand(96, generator=gen).to(dtype) + 0.5,
        ext.pack_linear_weight(torch.randn(256, 96, generator=gen).to(dtype) / 10),
        ext.pack_linear_weight(torch.randn(96, 128, generator=gen).to(dtype) / 10),
        torch.randn(128, 64, generator=gen),
    )
    static = [t.clone() for t in make_inputs(gen, tokens, vocab, num_blocks)]
    cache = torch.zeros(2, num_blocks, 16, 1, 64, dtype=dtype)

    graph = ext.CpuGraph()
    graph.begin_capture()
    try:
        outputs = block(ext, *static, weights, cache)
    finally:
        graph.end_capture()
    assert graph.num_nodes == 9  # every kernel call of `block`

    for _ in range(3):
        new = make_inputs(gen, tokens, vocab, num_blocks)
        for buffer, value in zip(static, new):
            buffer.copy_(value)
        expected_cache = cache.clone()
        expected = block(ext, *new, weights, expected_cache)
        before = [o.clone() for o in outputs]
        graph.replay()
        for got, want, old in zip(outputs, expected, before):
            assert torch.equal(got, want)
            assert not torch.equal(got, old)  # recomputed, not left over
        assert torch.equal(cache, expected_cache)


def test_calls_outside_a_capture_are_not_recorded(ext):
    x = torch.randn(2, 8)
    graph = ext.CpuGraph()
    ext.silu_and_mul(x)
    graph.begin_capture()
    out = ext.silu_and_mul(x)
    graph.end_capture()
    ext.silu_and_mul(x)
    assert graph.num_nodes == 1
    x.copy_(torch.randn(2, 8))
    graph.replay()
    assert torch.equal(out, ext.silu_and_mul(x))


def test_checks_on_the_data_run_at_every_replay(ext):
    k = torch.randn(1, 1, 8)
    cache = torch.zeros(2, 2, 4, 1, 8)
    slots = torch.tensor([3])
    graph = ext.CpuGraph()
    graph.begin_capture()
    ext.reshape_and_cache(k, k, cache, slots)
    graph.end_capture()
    slots.fill_(8)  # past the 8 slots
    with pytest.raises(RuntimeError, match="outside the cache"):
        graph.replay()
    ids = torch.tensor([1])
    weight = torch.randn(4, 8)
    graph = ext.CpuGraph()
    graph.begin_capture()
    ext.embedding(ids, weight)
    graph.end_capture()
    ids.fill_(4)
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        graph.replay()


def test_captures_do_not_nest_or_repeat(ext):
    first, second = ext.CpuGraph(), ext.CpuGraph()
    first.begin_capture()
    try:
        with pytest.raises(RuntimeError, match="already being captured"):
            second.begin_capture()
        with pytest.raises(RuntimeError, match="while capturing"):
            second.replay()
        ext.silu_and_mul(torch.randn(1, 4))
    finally:
        first.end_capture()
    with pytest.raises(RuntimeError, match="not being captured"):
        first.end_capture()
    with pytest.raises(RuntimeError, match="already captured"):
        first.begin_capture()
    second.replay()  # an empty graph does nothing


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_embedding_matches_torch_and_refuses_bad_ids(ext, dtype):
    weight = torch.randn(10, 6).to(dtype)
    ids = torch.tensor([3, 0, 9, 3])
    assert torch.equal(ext.embedding(ids, weight), torch.nn.functional.embedding(ids, weight))
    assert ext.embedding(ids[:0], weight).shape == (0, 6)
    for bad in ([10], [-1], [2**62]):
        with pytest.raises(RuntimeError, match="outside the vocabulary"):
            ext.embedding(torch.tensor(bad), weight)
    with pytest.raises(RuntimeError, match="int64"):
        ext.embedding(ids.to(torch.int32), weight)
