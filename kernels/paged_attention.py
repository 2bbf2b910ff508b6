"""Unified paged attention over a flattened batch, with a split-KV path.

One kernel serves every step: prefill chunks (causal within the chunk, also
attending to the request's earlier cached blocks) and single-token decodes sit
side by side in one flattened batch, and every query reads K/V through its
request's block table (PagedAttention, Kwon et al., 2023).

Grid and work split
-------------------
- axis 0: query blocks. Request i owns the query blocks
  `[qsl[i] // BLOCK_Q + i, qsl[i+1] // BLOCK_Q + i + 1)`; a program finds its
  request by binary search over `query_start_loc` (the same trick as vLLM's
  unified Triton kernel), so the grid `num_tokens // BLOCK_Q + num_reqs` needs
  only host integers and no per-step index tensor (CUDA-graph friendly). A few
  programs at the end of each request find no rows and exit at once.
- axis 1: KV heads. GQA without materialising repeated heads: the program owns
  one KV head and the GROUP query heads sharing it, so each K/V tile is loaded
  once for all of them. Its BLOCK_M rows are (query token, head in the group)
  pairs, row m = (m // GROUP, m % GROUP): BLOCK_Q = BLOCK_M // GROUP tokens.
- axis 2: KV splits (flash-decoding, Dao et al., 2023). With one split the
  program normalises and writes the output; with several, each split covers a
  contiguous range of KV tiles and writes an unnormalised partial (acc, running
  max, running sum) that `_reduce_splits_kernel` merges. Splits lift
  parallelism when query blocks x KV heads cannot fill the GPU's SMs: a
  decode at batch 1 with 8 KV heads is otherwise 8 programs on 132 SMs.

Inner loop (FlashAttention-2, Dao, 2023): KV in tiles of TILE_N keys, which
need not align with cache blocks: each key's physical block comes from the
block table, so one tile may gather several scattered blocks. Scores and the
accumulator are float32; softmax is online (running max m, running sum l,
rescale acc by exp(m_old - m_new)), in the exp2 domain with log2(e) folded
into the scale. A row whose keys are all masked so far keeps m = -inf; the
`m_safe` guard turns exp(-inf - -inf) into exp(-inf) = 0 instead of NaN.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634

# Split-KV heuristic knobs (see choose_num_splits). Tuned by reasoning, not yet
# by measurement: benchmarks/kernels/bench_decode_attention.py --splits sweeps them.
PROGRAMS_PER_SM = 4
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64


@triton.jit
def _find_request(query_start_loc_ptr, num_reqs, q_block, BLOCK_Q: tl.constexpr):
    """Largest i with query_start_loc[i] // BLOCK_Q + i <= q_block (strictly
    increasing in i, so binary search works)."""
    lo = 0
    hi = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


# The two integers that change from step to step: Triton would otherwise
# compile a variant for each of ==1, divisible by 16 and neither, of each,
# mid-serving (a block table's row stride is its step's widest request).
@triton.jit(do_not_specialize=["num_reqs", "stride_bt"])
def _paged_attention_kernel(
    out_ptr,
    q_ptr,
    cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    num_reqs,
    qk_scale,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_c_kv,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    stride_bt,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DECODE_ONLY: tl.constexpr,
    DOT_F32: tl.constexpr,
    PRECISION: tl.constexpr,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    if DECODE_ONLY:
        # Every request has at most one query: program i is request i.
        req = q_block
        local = 0
    else:
        req = _find_request(query_start_loc_ptr, num_reqs, q_block, BLOCK_Q)
        local = q_block - (tl.load(query_start_loc_ptr + req) // BLOCK_Q + req)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    # The request's queries are the last q_len of its seq_len positions.
    ctx_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_PAD)
    offs_n = tl.arange(0, TILE_N)
    q_idx = local * BLOCK_Q + offs_m // GROUP  # query index within the request
    head = kv_head * GROUP + offs_m % GROUP
    row_ok = (offs_m // GROUP < BLOCK_Q) & (q_idx < q_len)
    d_ok = offs_d < HEAD_SIZE
    tok = (q_start + q_idx).to(tl.int64)
    q = tl.load(
        q_ptr + tok[:, None] * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if DOT_F32:
        q = q.to(tl.float32)
    # Causal limit: query q_idx sits at position ctx_len + q_idx.
    q_pos = ctx_len + q_idx

    # Keys this query block can see at all, then this split's share of tiles.
    kv_end = tl.minimum(seq_len, ctx_len + (local + 1) * BLOCK_Q)
    num_tiles = tl.cdiv(kv_end, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    bt_row = block_table_ptr + req.to(tl.int64) * stride_bt
    head_off = kv_head.to(tl.int64) * stride_c_head

    for tile in range(tile_lo, tile_hi):
        pos = tile * TILE_N + offs_n
        pos_ok = pos < kv_end
        blk = tl.load(bt_row + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
        kv_off = blk * stride_c_block + (pos % BLOCK_SIZE).to(tl.int64) * stride_c_slot + head_off
        # K is loaded transposed, [HEAD_PAD, TILE_N], so the dot needs no tl.trans.
        k = tl.load(
            cache_ptr + kv_off[None, :] + offs_d[:, None],
            mask=pos_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        v = tl.load(
            cache_ptr + stride_c_kv + kv_off[:, None] + offs_d[None, :],
            mask=pos_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        # A cache in another dtype than the query's (kv_cache_dtype) is
        # converted here, in registers: the dot takes one dtype.
        k = k.to(q.dtype)
        v = v.to(q_ptr.dtype.element_ty)
        if DOT_F32:
            s = tl.dot(q, k.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, k, input_precision=PRECISION)
        s = s * qk_scale
        visible = pos_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        # P is rounded to the model's dtype before the PV product, as FA2
        # does, so the tensor cores see 16-bit operands.
        p = p.to(v.dtype)
        if DOT_F32:
            pv = tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p, v, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        tl.store(
            out_ptr + tok[:, None] * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )
    else:
        # Partials are [num_tokens, NUM_HEADS, NUM_SPLITS] (+ HEAD_SIZE for acc);
        # every (token, head, split) is written, an empty split as m=-inf, l=0.
        part = (tok * NUM_HEADS + head) * NUM_SPLITS + split
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)
        tl.store(
            part_acc_ptr + part[:, None] * HEAD_SIZE + offs_d[None, :],
            acc,
            mask=row_ok[:, None] & d_ok[None, :],
        )


@triton.jit
def _reduce_splits_kernel(
    out_ptr,
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    stride_o_tok,
    stride_o_head,
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """Merge split partials: out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s."""
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    s_ok = offs_s < NUM_SPLITS
    d_ok = offs_d < HEAD_SIZE
    base = (tok * NUM_HEADS + head) * NUM_SPLITS
    m = tl.load(part_m_ptr + base + offs_s, mask=s_ok, other=float("-inf"))
    l_s = tl.load(part_l_ptr + base + offs_s, mask=s_ok, other=0.0)
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_safe)
    denom = tl.sum(w * l_s, 0)
    denom = tl.where(denom == 0.0, 1.0, denom)
    acc = tl.load(
        part_acc_ptr + (base + offs_s)[:, None] * HEAD_SIZE + offs_d[None, :],
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    out = tl.sum(acc * w[:, None], 0) / denom
    tl.store(
        out_ptr + tok * stride_o_tok + head * stride_o_head + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_ok,
    )


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    # The interpreter runs programs one by one: extra splits only cost time.
    return 1


def choose_num_splits(num_q_blocks: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """How many KV splits (flash-decoding) to launch.

    Split only when query blocks x KV heads leave the SMs short of work
    (`PROGRAMS_PER_SM` per SM keeps enough loads in flight to saturate HBM),
    never below `MIN_TOKENS_PER_SPLIT` keys per split (the partials and the
    reduction would cost more than they win), and to a power of two so few
    kernel variants are compiled. The kernel derives each split's range from
    the request's actual length, so any value is correct; a CUDA-graph runner
    may pin one value for all replays of a batch size.
    """
    programs = num_q_blocks * num_kv_heads
    target = PROGRAMS_PER_SM * num_sms
    if programs >= target:
        return 1
    splits = min(
        math.ceil(target / programs),
        max(1, max_seq_len // MIN_TOKENS_PER_SPLIT),
        MAX_SPLITS,
    )
    return 1 << (splits.bit_length() - 1)  # round down to a power of two


def paged_attention_triton(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int,
    max_seq_len: int,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    tile_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Triton launch of `paged_attention` (see `pagoda.kernels.ops`).

    `num_splits`, `tile_n`, `num_warps` and `num_stages` override the launch
    heuristics; benchmarks/kernels/bench_decode_attention.py sweeps them.
    """
    num_tokens, num_heads, head_size = query.shape
    _, _, block_size, num_kv_heads, cache_head_size = kv_cache.shape
    assert cache_head_size == head_size and num_heads % num_kv_heads == 0
    assert query.stride(-1) == 1 and kv_cache.stride(-1) == 1
    num_reqs = seq_lens.shape[0]
    if out is None:
        out = torch.empty_like(query)
    if num_tokens == 0 or num_reqs == 0:
        return out
    group = num_heads // num_kv_heads
    head_pad = max(16, triton.next_power_of_2(head_size))
    decode_only = max_query_len == 1
    if decode_only:
        # tl.dot wants M >= 16: a decode's GROUP rows are padded to 16.
        block_m = max(16, triton.next_power_of_2(group))
        block_q = 1
        num_q_blocks = num_reqs
    else:
        block_m = max(64, triton.next_power_of_2(group))
        block_q = block_m // group
        num_q_blocks = num_tokens // block_q + num_reqs
    if tile_n is None:
        tile_n = 64 if head_pad <= 128 else 32
    if num_warps is None:
        # A decode's 16-row tiles need no more than 2 warps: on an H100 (bf16,
        # head 128, GQA 8) 2 warps beat 4 at every batch and context swept
        # (docs/benchmarks.md, GPU section); prefill's 64-row tiles keep 4.
        num_warps = 2 if decode_only else 4
    if num_stages is None:
        num_stages = 3 if decode_only else 2
    if num_splits is None:
        num_splits = choose_num_splits(
            num_q_blocks, num_kv_heads, max_seq_len, _num_sms(query.device)
        )
    dot_f32 = _interpreting() and query.dtype != torch.float32
    precision = "ieee" if query.dtype == torch.float32 else "tf32"

    if num_splits > 1:
        part_acc = torch.empty(
            (num_tokens, num_heads, num_splits, head_size), dtype=torch.float32, device=query.device
        )
        part_m = torch.empty(
            (num_tokens, num_heads, num_splits), dtype=torch.float32, device=query.device
        )
        part_l = torch.empty_like(part_m)
    else:
        part_acc = part_m = part_l = out  # unused: NUM_SPLITS == 1 never touches them

    _paged_attention_kernel[(num_q_blocks, num_kv_heads, num_splits)](
        out,
        query,
        kv_cache,
        block_table,
        seq_lens,
        query_start_loc,
        part_acc,
        part_m,
        part_l,
        num_reqs,
        scale * LOG2E,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        block_table.stride(0),
        NUM_HEADS=num_heads,
        GROUP=group,
        HEAD_SIZE=head_size,
        HEAD_PAD=head_pad,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE_N=tile_n,
        NUM_SPLITS=num_splits,
        DECODE_ONLY=decode_only,
        DOT_F32=dot_f32,
        PRECISION=precision,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if num_splits > 1:
        _reduce_splits_kernel[(num_tokens, num_heads)](
            out,
            part_acc,
            part_m,
            part_l,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            HEAD_SIZE=head_size,
            HEAD_PAD=head_pad,
            NUM_SPLITS=num_splits,
            SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
            num_warps=4,
        )
    return out


def warm_up_paged_attention(
    kv_cache: torch.Tensor, num_heads: int, dtype: torch.dtype, scale: float
) -> int:
    """Compile every launch variant a step can need, before serving: decode
    and mixed batches at each split factor `choose_num_splits` can return
    (and their reductions), on a one-block batch of this cache.

    On an H100, a split factor or batch kind first met mid-serving stopped
    the engine for a compile of about 0.6 s (the first request's TTFT at
    concurrency 1: 663 ms against a median of 21). Returns the launches made.
    """
    device = kv_cache.device
    head_size = kv_cache.shape[-1]
    num_splits = [1 << i for i in range(MAX_SPLITS.bit_length())]
    launches = 0
    for query_len in (1, 2):  # a decode-only batch, then one with a prefill chunk
        query = torch.zeros((query_len, num_heads, head_size), dtype=dtype, device=device)
        block_table = torch.zeros((1, 1), dtype=torch.int32, device=device)
        seq_lens = torch.full((1,), query_len, dtype=torch.int32, device=device)
        query_start_loc = torch.tensor([0, query_len], dtype=torch.int32, device=device)
        for splits in num_splits:
            paged_attention_triton(
                query,
                kv_cache,
                block_table,
                seq_lens,
                query_start_loc,
                scale,
                max_query_len=query_len,
                max_seq_len=query_len,
                num_splits=splits,
            )
            launches += 1
    return launches
