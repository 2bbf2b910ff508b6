"""The C++ CPU prefill attention kernel against float64 causal attention
computed per request from its own keys and values, read through scattered
blocks of a paged cache whose other slots hold NaN (a read past a request's
context, or of a position a query must not see, shows up as NaN)."""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels.cpu import build

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
BLOCK = 16


@pytest.fixture(scope="module")
def op():
    return build().prefill_attention


def make_step(chunks, num_kv_heads, group, head_size, dtype, seed=0, cache_dtype=None):
    """One step of requests; chunks[i] = (seq_len, q_len): the request's
    queries are its last q_len positions. The cache holds each request's
    K/V at every position (the step's own were written before attention),
    in `cache_dtype` (default: the query's)."""
    cache_dtype = cache_dtype or dtype
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-n // BLOCK) for n, _ in chunks]
    num_blocks = sum(blocks) + 3
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    cache = torch.full((2, num_blocks, BLOCK, num_kv_heads, head_size), float("nan"))
    table = torch.zeros(len(chunks), max(blocks), dtype=torch.int32)
    keys, values = [], []
    for r, ((n, _), b) in enumerate(zip(chunks, blocks)):
        ids = [pool.pop() for _ in range(b)]
        table[r, :b] = torch.tensor(ids, dtype=torch.int32)
        table[r, b:] = pool[0]  # stale entries point at a block of NaN
        k = torch.randn(n, num_kv_heads, head_size, generator=gen)
        v = torch.randn(n, num_kv_heads, head_size, generator=gen)
        pos = torch.arange(n)
        cache[0, table[r, pos // BLOCK].long(), pos % BLOCK] = k
        cache[1, table[r, pos // BLOCK].long(), pos % BLOCK] = v
        keys.append(k.to(cache_dtype))
        values.append(v.to(cache_dtype))
    q_lens = [q for _, q in chunks]
    qsl = torch.zeros(len(chunks) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(q_lens).cumsum(0)
    query = torch.randn(int(qsl[-1]), num_kv_heads * group, head_size, generator=gen)
    lens = torch.tensor([n for n, _ in chunks], dtype=torch.int32)
    return query.to(dtype), cache.to(cache_dtype), table, lens, qsl, keys, values


def reference(q, k, v, scale):
    """q [Q, Hq, D] at the last Q of S positions, k/v [S, Hkv, D] -> [Q, Hq, D]."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s_len, q_len = k.shape[0], q.shape[0]
    scores = torch.einsum("qhd,shd->hqs", q, k) * scale
    qpos = torch.arange(q_len)[:, None] + s_len - q_len
    scores = scores.masked_fill(torch.arange(s_len)[None, :] > qpos, float("-inf"))
    return torch.einsum("hqs,shd->qhd", scores.softmax(-1), v)


def check(op, chunks, num_kv_heads, group, head_size, dtype, rows=None, cache_dtype=None):
    query, cache, table, lens, qsl, keys, values = make_step(
        chunks, num_kv_heads, group, head_size, dtype, cache_dtype=cache_dtype
    )
    scale = head_size**-0.5
    rows = torch.arange(len(chunks)) if rows is None else torch.tensor(rows)
    out = torch.full_like(query, 7.0)
    op(out, query, cache, table, lens, qsl, rows.long(), scale)
    tol = max(TOLERANCE[dtype], TOLERANCE[cache_dtype or dtype])
    for r in range(len(chunks)):
        got = out[qsl[r] : qsl[r + 1]]
        if r not in rows.tolist():
            assert (got == 7.0).all(), "a request outside `rows` was written"
            continue
        ref = reference(query[qsl[r] : qsl[r + 1]], keys[r], values[r], scale)
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_whole_prompts_match_causal_attention(op, dtype):
    check(op, [(1 + 0, 1), (17, 17), (64, 64), (100, 100), (270, 270)], 3, 3, 64, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_chunks_after_a_cached_prefix_see_it_all(op, group, dtype):
    # Chunked prefill and prefix-cache hits: the queries start mid-block, and
    # the keys come in spans of two blocks with an odd block at the end (300
    # positions: 19 blocks) or none (512: 32).
    chunks = [(40, 7), (300, 45), (33, 32), (512, 1), (129, 100)]
    check(op, chunks, 2, group, 64, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_head_size_128(op, dtype):
    check(op, [(90, 90), (200, 31), (47, 3)], 2, 2, 128, dtype)


@pytest.mark.parametrize(
    "dtype, cache_dtype",
    [
        (torch.float32, torch.float16),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.bfloat16, torch.float16),
    ],
)
@pytest.mark.parametrize("head_size", [64, 128])
def test_a_cache_in_another_dtype_than_the_model(op, dtype, cache_dtype, head_size):
    chunks = [(17, 17), (100, 100), (300, 45), (64, 1)]
    check(op, chunks, 2, 3, head_size, dtype, cache_dtype=cache_dtype)


def test_only_the_listed_requests_are_computed(op):
    # The step's decodes are another kernel's: the rows leave them alone.
    check(op, [(50, 50), (20, 1), (70, 5), (9, 1)], 3, 3, 64, torch.float32, rows=[0, 2])


def test_out_of_range_inputs_are_refused(op):
    query, cache, table, lens, qsl, *_ = make_step([(40, 40)], 3, 3, 64, torch.float32)
    out = torch.empty_like(query)
    rows = torch.tensor([0])
    bad_table = table.clone()
    bad_table[0, 1] = cache.shape[1]
    with pytest.raises(RuntimeError, match="outside the cache"):
        op(out, query, cache, bad_table, lens, qsl, rows, 0.1)
    with pytest.raises(RuntimeError, match="seq_lens"):
        op(out, query, cache, table, torch.tensor([39], dtype=torch.int32), qsl, rows, 0.1)
    with pytest.raises(RuntimeError, match="not a request"):
        op(out, query, cache, table, lens, qsl, torch.tensor([1]), 0.1)
    with pytest.raises(RuntimeError, match="head size"):
        q = torch.zeros(40, 3, 32)
        op(q, q, torch.zeros(2, 4, BLOCK, 3, 32), table, lens, qsl, rows, 0.1)
