"""Unified paged attention (and its split-KV path) against its torch twin and
against a float64 attention computed from the true K/V."""

from __future__ import annotations

import importlib

import pytest
import torch
from pagoda.kernels import reference
from pagoda.kernels.ops import paged_attention

# (query_len, seq_len) per request: decodes at odd lengths and at a block
# boundary, a prefill chunk starting mid-block after cached context, a whole
# prompt, and a one-token sequence.
MIXED = [(1, 37), (11, 29), (1, 32), (20, 20), (1, 1), (5, 70)]


def _check(batch, out, scale, tol, attention_reference, rel_err):
    assert not out.isnan().any()
    twin = reference.paged_attention_ref(
        batch.query,
        batch.kv_cache,
        batch.metadata.block_table,
        batch.metadata.seq_lens,
        batch.metadata.query_start_loc,
        scale,
    )
    assert rel_err(out, twin) < tol
    assert rel_err(out, attention_reference(batch, scale)) < tol


@pytest.mark.parametrize("group", [1, 3, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_batch_matches_reference_for_each_gqa_ratio(
    group, dtype, paged_batch, attention_reference, rel_err, tolerance, attend
):
    batch = paged_batch(
        MIXED,
        num_kv_heads=2,
        group=group,
        head_size=64,
        block_size=16,
        dtype=dtype,
        seed=100 + group,
    )
    scale = 64**-0.5
    out = attend(batch, scale)
    _check(batch, out, scale, tolerance[dtype], attention_reference, rel_err)


@pytest.mark.parametrize(
    ("head_size", "block_size", "dtype"),
    [
        (128, 32, torch.float32),
        (128, 16, torch.float16),
        (64, 32, torch.bfloat16),
        (96, 16, torch.float32),  # not a power of two: padded lanes are masked
    ],
)
def test_head_and_block_sizes(
    head_size, block_size, dtype, paged_batch, attention_reference, rel_err, tolerance, attend
):
    specs = [(1, 45), (17, 50), (3, 3), (1, 96)]
    batch = paged_batch(
        specs,
        num_kv_heads=1,
        group=4,
        head_size=head_size,
        block_size=block_size,
        dtype=dtype,
        seed=head_size + block_size,
    )
    scale = head_size**-0.5
    out = attend(batch, scale)
    _check(batch, out, scale, tolerance[dtype], attention_reference, rel_err)


def test_smollm2_shape_prefill_then_decode(
    paged_batch, attention_reference, rel_err, tolerance, attend
):
    # SmolLM2-135M: 9 query heads, 3 KV heads, head size 64.
    batch = paged_batch(
        [(13, 13), (1, 40), (7, 23)],
        num_kv_heads=3,
        group=3,
        head_size=64,
        block_size=16,
        dtype=torch.float32,
        seed=7,
    )
    out = attend(batch, 0.125)
    _check(batch, out, 0.125, tolerance[torch.float32], attention_reference, rel_err)


@pytest.mark.parametrize("num_splits", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_kv_decode_long_context(
    num_splits, dtype, paged_batch, attention_reference, rel_err, tolerance, attend
):
    # Splits outnumbering one request's tiles leave some splits empty (m = -inf).
    batch = paged_batch(
        [(1, 300), (1, 77), (1, 5)],
        num_kv_heads=2,
        group=4,
        head_size=64,
        block_size=16,
        dtype=dtype,
        seed=200 + num_splits,
    )
    scale = 0.125
    out = attend(batch, scale, num_splits=num_splits)
    _check(batch, out, scale, tolerance[dtype], attention_reference, rel_err)


def test_split_kv_on_mixed_batch(paged_batch, attention_reference, rel_err, tolerance, attend):
    # The split path stays correct with prefill chunks, whose rows see
    # different causal limits within one query block.
    batch = paged_batch(
        MIXED, num_kv_heads=2, group=3, head_size=64, block_size=16, dtype=torch.float32, seed=300
    )
    out = attend(batch, 0.125, num_splits=2)
    _check(batch, out, 0.125, tolerance[torch.float32], attention_reference, rel_err)


def test_split_kv_chosen_automatically_for_long_contexts_at_small_batch():
    from pagoda.kernels.paged_attention import choose_num_splits

    # Batch 1, 8 KV heads, 32k context on 132 SMs: split.
    assert choose_num_splits(1, 8, 32768, 132) > 1
    # Short context: the partials would cost more than they win.
    assert choose_num_splits(1, 8, 256, 132) == 1
    # Enough programs already: no split.
    assert choose_num_splits(256, 8, 32768, 132) == 1
    for args in [(1, 1, 10**6, 132), (3, 4, 5000, 132)]:
        n = choose_num_splits(*args)
        assert 1 <= n <= 64 and n & (n - 1) == 0


@pytest.mark.parametrize("num_splits", [1, 4])
def test_requests_of_no_positions_come_back_zero(num_splits, paged_batch, device, attend):
    """A decode graph pads its batch with requests of length 0 (one query
    token, no keys, not even its own): each comes out zero, and the real
    requests as without them."""
    batch = paged_batch(
        [(1, 70), (1, 9)],
        num_kv_heads=2,
        group=4,
        head_size=64,
        block_size=16,
        dtype=torch.float32,
        seed=12,
    )
    alone = attend(batch, 0.125, num_splits=num_splits)
    md, pad = batch.metadata, 3
    query = torch.cat([batch.query, torch.randn(pad, *batch.query.shape[1:], device=device)])
    out = torch.full_like(query, float("nan"))
    paged_attention(
        query,
        batch.kv_cache,
        torch.cat([md.block_table, md.block_table[:1].expand(pad, -1)]),
        torch.cat([md.seq_lens, torch.zeros(pad, dtype=torch.int32, device=device)]),
        torch.arange(2 + pad + 1, dtype=torch.int32, device=device),
        0.125,
        max_query_len=1,
        max_seq_len=md.max_seq_len,
        out=out,
        num_splits=num_splits,
    )
    assert torch.equal(out[:2], alone)
    assert (out[2:] == 0).all()


def test_warm_up_launches_every_variant_a_step_can_choose(device, monkeypatch):
    """The warm-up compiles, for decode-only and mixed batches, every split
    factor `choose_num_splits` can return: one it leaves out would be
    compiled in a serving step instead."""
    # The module, not the `paged_attention` op that pagoda.kernels exports.
    pa = importlib.import_module("pagoda.kernels.paged_attention")

    launched = []
    real = pa.paged_attention_triton

    def record(query, *args, max_query_len, num_splits, **kwargs):
        launched.append((max_query_len == 1, num_splits))
        return real(query, *args, max_query_len=max_query_len, num_splits=num_splits, **kwargs)

    monkeypatch.setattr(pa, "paged_attention_triton", record)
    cache = torch.randn(2, 4, 16, 1, 32, device=device)
    before = cache.clone()
    assert pa.warm_up_paged_attention(cache, 2, torch.float32, 32**-0.5) == len(launched)
    assert torch.equal(cache, before)  # it reads the cache, writes none of it
    chosen = {
        pa.choose_num_splits(blocks, kv_heads, seq_len, sms)
        for blocks in (1, 2, 3, 7, 64, 1000)
        for kv_heads in (1, 2, 8)
        for seq_len in (1, 200, 4096, 10**6)
        for sms in (1, 16, 132)
    }
    for decode_only in (True, False):
        assert chosen <= {splits for kind, splits in launched if kind == decode_only}
