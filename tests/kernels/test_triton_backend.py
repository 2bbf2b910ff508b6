"""TritonAttentionBackend end to end: write the step's K/V, then attend, against
a float64 attention from the true K/V of each request."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pagoda.runtime.attention.backend import AttentionMetadata, kv_cache_shape
from pagoda.runtime.attention.triton_backend import TritonAttentionBackend


@pytest.mark.parametrize(
    ("group", "dtype", "block_size"),
    [
        (1, torch.float32, 16),
        (3, torch.float32, 32),
        (4, torch.bfloat16, 16),
        (8, torch.bfloat16, 32),
    ],
)
def test_mixed_step_matches_reference(
    group, dtype, block_size, paged_batch, attention_reference, rel_err, tolerance
):
    batch = paged_batch(
        [(1, 50), (9, 41), (24, 24), (1, 17)],
        num_kv_heads=2,
        group=group,
        head_size=64,
        block_size=block_size,
        dtype=dtype,
        seed=400 + group,
    )
    out = TritonAttentionBackend().forward(
        batch.query, batch.key, batch.value, batch.kv_cache, batch.metadata, 0.125
    )
    assert out.shape == batch.query.shape and out.dtype == dtype
    assert not out.isnan().any()
    assert rel_err(out, attention_reference(batch, 0.125)) < tolerance[dtype]


@pytest.mark.parametrize(
    ("dtype", "cache_dtype"),
    [
        (torch.float32, torch.float16),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.float16),
    ],
)
@pytest.mark.parametrize("specs", [[(1, 50), (9, 41), (24, 24), (1, 17)], [(1, 70), (1, 9)]])
def test_a_cache_in_another_dtype_than_the_model(
    dtype, cache_dtype, specs, paged_batch, attention_reference, rel_err, tolerance
):
    """kv_cache_dtype: the write rounds the step's K/V into the cache and the
    kernel converts what it loads; the output is in the model's dtype, as
    close to attention over the cached K/V as that dtype allows."""
    batch = paged_batch(
        specs,
        num_kv_heads=2,
        group=3,
        head_size=64,
        block_size=16,
        dtype=dtype,
        seed=11,
        cache_dtype=cache_dtype,
    )
    out = TritonAttentionBackend().forward(
        batch.query, batch.key, batch.value, batch.kv_cache, batch.metadata, 0.125
    )
    assert out.dtype == dtype and batch.kv_cache.dtype == cache_dtype
    assert rel_err(out, attention_reference(batch, 0.125)) < tolerance[dtype]


def test_decode_step_with_pinned_splits(paged_batch, attention_reference, rel_err, tolerance):
    batch = paged_batch(
        [(1, 200), (1, 9), (1, 130)],
        num_kv_heads=1,
        group=8,
        head_size=64,
        block_size=16,
        dtype=torch.float32,
        seed=5,
    )
    out = TritonAttentionBackend(num_splits=4).forward(
        batch.query, batch.key, batch.value, batch.kv_cache, batch.metadata, 0.125
    )
    assert rel_err(out, attention_reference(batch, 0.125)) < tolerance[torch.float32]


def test_padded_rows_are_not_written_and_come_back_zero(
    paged_batch, attention_reference, rel_err, tolerance, device
):
    batch = paged_batch(
        [(1, 20), (1, 33)],
        num_kv_heads=2,
        group=2,
        head_size=64,
        block_size=16,
        dtype=torch.float32,
        seed=6,
    )
    pad = 3
    query = torch.cat([batch.query, torch.randn(pad, *batch.query.shape[1:], device=device)])
    key = torch.cat([batch.key, torch.randn(pad, *batch.key.shape[1:], device=device)])
    value = torch.cat([batch.value, torch.randn(pad, *batch.value.shape[1:], device=device)])
    md = dataclasses.replace(
        batch.metadata,
        slot_mapping=torch.cat(
            [batch.metadata.slot_mapping, torch.full((pad,), -1, device=device)]
        ),
    )
    nan_before = batch.kv_cache.isnan().sum() - batch.key.numel() * 2
    out = TritonAttentionBackend().forward(query, key, value, batch.kv_cache, md, 0.125)
    assert batch.kv_cache.isnan().sum() == nan_before
    assert torch.equal(out[-pad:], torch.zeros_like(out[-pad:]))
    assert rel_err(out[:-pad], attention_reference(batch, 0.125)) < tolerance[torch.float32]


def test_request_reads_a_shared_block_written_earlier_in_the_same_step(rel_err, device):
    """Two requests share a prompt's first block (prefix cache): A prefills
    it in this step while B, whose context is that block, decodes after it."""
    torch.manual_seed(9)
    bs, kv_heads, heads, d = 16, 1, 4, 64
    cache = torch.full(kv_cache_shape(4, bs, kv_heads, d), float("nan"))
    prompt_k, prompt_v = torch.randn(18, kv_heads, d), torch.randn(18, kv_heads, d)
    b_k, b_v = torch.randn(1, kv_heads, d), torch.randn(1, kv_heads, d)
    # A: 18-token prompt in blocks [2, 0]. B: shares block 2, own token 16 in block 3.
    query = torch.randn(19, heads, d)
    key = torch.cat([prompt_k, b_k])
    value = torch.cat([prompt_v, b_v])
    slots = torch.tensor([2 * bs + i for i in range(16)] + [0, 1] + [3 * bs])
    qsl = torch.tensor([0, 18, 19], dtype=torch.int32)
    seq_lens = torch.tensor([18, 17], dtype=torch.int32)
    cache, query, key, value, slots = (t.to(device) for t in (cache, query, key, value, slots))
    md = AttentionMetadata(
        num_actual_tokens=19,
        num_reqs=2,
        max_query_len=18,
        max_seq_len=18,
        query_start_loc=qsl.to(device),
        seq_lens=seq_lens.to(device),
        block_table=torch.tensor([[2, 0], [2, 3]], dtype=torch.int32, device=device),
        slot_mapping=slots,
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
    )
    out = TritonAttentionBackend().forward(query, key, value, cache, md, 0.125)
    k = torch.cat([prompt_k[:16], b_k]).double().repeat_interleave(heads, 1)
    v = torch.cat([prompt_v[:16], b_v]).double().repeat_interleave(heads, 1)
    s = torch.einsum("hd,khd->hk", query[18].double().cpu(), k) * 0.125
    expected = torch.einsum("hk,khd->hd", s.softmax(-1), v)
    assert rel_err(out[18], expected) < 1e-5
