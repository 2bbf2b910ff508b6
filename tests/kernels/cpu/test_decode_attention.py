"""The C++ CPU decode attention kernel against float64 attention computed
per request from its own keys and values, read through scattered blocks of
a paged cache whose other slots hold NaN (a read past a request's context
shows up as NaN in its output)."""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels.cpu import build

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


@pytest.fixture(scope="module")
def op():
    # Built, not skipped: the machines that run the suite have a compiler,
    # and a kernel that stopped compiling must fail here.
    return build().decode_attention


def make_batch(
    seq_lens, num_kv_heads, group, head_size, block_size, dtype, seed=0, cache_dtype=None
):
    """Requests with `seq_lens` tokens of context each, scattered over the
    cache's blocks; one query token per request. The cache is in
    `cache_dtype` (default: the query's), and so are the keys and values
    returned for the reference: what the kernel reads."""
    cache_dtype = cache_dtype or dtype
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks) + 3
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_size), float("nan"))
    width = max(blocks)
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    keys, values = [], []
    for r, (n, b) in enumerate(zip(seq_lens, blocks)):
        ids = [pool.pop() for _ in range(b)]
        table[r, :b] = torch.tensor(ids, dtype=torch.int32)
        # Unused table entries point at a block of NaN, as a stale table would.
        table[r, b:] = pool[0]
        k = torch.randn(n, num_kv_heads, head_size, generator=gen)
        v = torch.randn(n, num_kv_heads, head_size, generator=gen)
        pos = torch.arange(n)
        cache[0, table[r, pos // block_size].long(), pos % block_size] = k
        cache[1, table[r, pos // block_size].long(), pos % block_size] = v
        keys.append(k.to(cache_dtype))
        values.append(v.to(cache_dtype))
    query = torch.randn(len(seq_lens), num_kv_heads * group, head_size, generator=gen)
    return query.to(dtype), cache.to(cache_dtype), table, keys, values


def reference(q, k, v, scale):
    """q [Hq, D], k/v [S, Hkv, D] -> [Hq, D] in float64."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    probs = (torch.einsum("hd,shd->hs", q, k) * scale).softmax(-1)
    return torch.einsum("hs,shd->hd", probs, v)


def check(
    op, seq_lens, num_kv_heads, group, head_size, block_size, dtype, tokens=None, cache_dtype=None
):
    query, cache, table, keys, values = make_batch(
        seq_lens, num_kv_heads, group, head_size, block_size, dtype, cache_dtype=cache_dtype
    )
    scale = head_size**-0.5
    num_reqs = len(seq_lens)
    if tokens is None:
        tokens = torch.arange(num_reqs)
    # The decodes' queries sit at `tokens` among other (prefill) rows, which
    # the kernel must leave alone.
    rows = int(tokens.max()) + 1
    q_all = torch.randn(rows, *query.shape[1:]).to(dtype)
    q_all[tokens] = query
    out = torch.full_like(q_all, 7.0)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    op(out, q_all, cache, table, lens, tokens.long(), scale)
    others = torch.ones(rows, dtype=torch.bool)
    others[tokens] = False
    assert (out[others] == 7.0).all()
    tol = max(TOLERANCE[dtype], TOLERANCE[cache_dtype or dtype])
    for r in range(num_reqs):
        ref = reference(query[r], keys[r], values[r], scale)
        torch.testing.assert_close(out[tokens[r]].double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_size", [64, 128, 80])
@pytest.mark.parametrize("block_size", [16, 32])
def test_ragged_decodes_match_reference(op, dtype, head_size, block_size):
    seq_lens = [1, 15, 16, 17, 33, 100, 257]
    check(op, seq_lens, 2, 3, head_size, block_size, dtype)


@pytest.mark.parametrize("group", [1, 4, 8])
def test_grouped_query_heads(op, group):
    check(op, [5, 64, 300], 2, group, 64, 16, torch.bfloat16)


def test_decodes_among_prefill_rows_and_two_threads(op):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        check(op, [40, 3, 129], 3, 3, 64, 16, torch.float32, tokens=torch.tensor([2, 9, 10]))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "dtype, cache_dtype",
    [
        (torch.float32, torch.float16),  # llama.cpp's default under f32 weights
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.bfloat16, torch.float16),
    ],
)
@pytest.mark.parametrize("head_size", [64, 128, 80])  # 80: the scalar path
def test_a_cache_in_another_dtype_than_the_model(op, dtype, cache_dtype, head_size):
    check(op, [1, 17, 100, 257], 2, 3, head_size, 16, dtype, cache_dtype=cache_dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # batch 1: split over the threads
        check(op, [300], 3, 3, head_size, 16, dtype, cache_dtype=cache_dtype)
    finally:
        torch.set_num_threads(threads)


def test_long_context(op):
    check(op, [4096], 1, 4, 128, 16, torch.bfloat16)


@pytest.mark.parametrize(
    "threads, seq_lens",
    [
        (2, [300]),  # batch 1 on two threads: two pieces
        (3, [200]),  # three pieces, cut on 16-position steps
        (2, [40]),  # too short to cut: one thread computes it
        (8, [64, 127, 128, 500]),  # 819 positions over 8 threads: 500 is cut, the rest whole
        (16, [1100]),  # sixteen pieces
        (16, [2000, 5]),  # a split request beside one too short to split
        # Many requests: the threads' runs of positions cut a request each.
        (2, [33, 576, 100, 17, 1, 300, 450, 64, 250, 96, 512, 40, 200, 380, 129, 60]),
        (3, [1, 15, 16, 17, 33, 100, 257]),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_size, block_size", [(64, 16), (128, 32)])
def test_positions_split_evenly_over_threads(op, threads, seq_lens, dtype, head_size, block_size):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        check(
            op, seq_lens, 3, 3, head_size, block_size, dtype, tokens=torch.arange(len(seq_lens)) * 2
        )
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [2, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_of_no_positions_is_zero_and_moves_no_cut(op, threads, dtype):
    """A decode graph pads its batch with rows of length 0: each comes out
    zero, and the real rows come out bit for bit as without them (a padded
    row of length 1 moved the thread cuts of real requests, and with them
    the float sums)."""
    seq_lens = [300, 77, 1000, 45]
    query, cache, table, _, _ = make_batch(seq_lens, 3, 3, 64, 16, dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = torch.empty_like(query)
        lens = torch.tensor(seq_lens, dtype=torch.int32)
        op(alone, query, cache, table, lens, torch.arange(4), 0.125)
        padded_q = torch.cat([query, torch.randn(3, *query.shape[1:]).to(dtype)])
        padded_table = torch.cat([table, table[:3]])
        padded = torch.full_like(padded_q, float("nan"))
        padded_lens = torch.tensor(seq_lens + [0, 0, 0], dtype=torch.int32)
        op(padded, padded_q, cache, padded_table, padded_lens, torch.arange(7), 0.125)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(padded[:4], alone)
    assert (padded[4:] == 0).all()


def test_refuses_what_it_cannot_read(op):
    query, cache, table, _, _ = make_batch([8, 9], 2, 2, 64, 16, torch.float32)
    out = torch.empty_like(query)
    lens = torch.tensor([8, 9], dtype=torch.int32)
    tokens = torch.arange(2)
    with pytest.raises(RuntimeError, match="block_table"):
        op(out, query, cache, table.long(), lens, tokens, 0.1)
    with pytest.raises(RuntimeError, match="dtypes differ"):
        op(out, query.double(), cache, table, lens, tokens, 0.1)
    with pytest.raises(RuntimeError, match="query dtype must be float32, bfloat16 or float16"):
        op(out.double(), query.double(), cache, table, lens, tokens, 0.1)
    with pytest.raises(RuntimeError, match="kv_cache dtype must be"):
        op(out, query, cache.double(), table, lens, tokens, 0.1)
    with pytest.raises(RuntimeError, match="multiple of KV heads"):
        op(out[:, :3], query[:, :3], cache, table, lens, tokens, 0.1)
    with pytest.raises(RuntimeError, match="one row per request"):
        op(out, query, cache, table, lens[:1], tokens, 0.1)
    with pytest.raises(RuntimeError, match="outside 0"):
        op(out, query, cache, table, torch.tensor([8, 33], dtype=torch.int32), tokens, 0.1)
    bad = table.clone()
    bad[1, 0] = 10_000
    with pytest.raises(RuntimeError, match="outside the cache"):
        op(out, query, cache, bad, lens, tokens, 0.1)
    with pytest.raises(RuntimeError, match="token_index"):
        op(out, query, cache, table, lens, torch.tensor([0, 5]), 0.1)
