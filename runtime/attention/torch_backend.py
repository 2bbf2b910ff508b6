"""Paged attention in plain torch: runs on any device and is the oracle the
Triton kernels are checked against.

On the CPU a step's decodes and prefill chunks go to the C++ kernels of
`pagoda.kernels.cpu` where they build (the model runner passes them in):
they read K and V in place through the block table, where the torch path
below gathers every request's context each layer (decodes 2-10x slower,
prefill chunks 1.4-5x). The torch path remains the
fallback and the reference the kernels are tested against.

Decodes (one query token) of the whole step are computed together: their
context is gathered from the paged cache through the block table into a
padded [requests, max_context] tensor, and two batched matmuls with a padding
mask compute their attention. Prefill chunks are
computed one request at a time (a step holds few of them), each with a causal
mask shifted by the tokens already cached before the chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pagoda.kernels.reference import reshape_and_cache_ref
from pagoda.runtime.attention.backend import AttentionBackend, AttentionMetadata


def gather_kv(
    kv_cache: torch.Tensor, block_table: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the first `num_tokens` positions of each request's block
    table, as [R, Hkv, num_tokens, D] (strided views of one gathered copy)."""
    used = -(-num_tokens // kv_cache.shape[2])
    ids = block_table[:, :used].reshape(-1).long()
    return _gather_blocks(kv_cache, ids, block_table.shape[0], num_tokens)


def _gather_blocks(
    kv_cache: torch.Tensor, block_ids: torch.Tensor, num_reqs: int, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    _, num_blocks, _, num_kv_heads, head_size = kv_cache.shape
    # index_select over whole blocks seen as rows: about 10x faster on the
    # CPU than advanced indexing of kv_cache[:, blocks] (measured).
    rows = kv_cache.view(2, num_blocks, -1)
    shape = (num_reqs, -1, num_kv_heads, head_size)
    k = rows[0].index_select(0, block_ids).view(shape)
    v = rows[1].index_select(0, block_ids).view(shape)
    return k[:, :num_tokens].transpose(1, 2), v[:, :num_tokens].transpose(1, 2)


@dataclass
class _StepPlan:
    """What every layer of one step needs and only the step decides: which
    requests decode, their gather indices and padding mask, and the prefill
    chunks. Built by the first layer, reused by the others."""

    decode_tokens: torch.Tensor | None  # flat token index of each decode
    decode_block_ids: torch.Tensor | None  # [R_dec * blocks] for index_select
    decode_padding: torch.Tensor | None  # [R_dec, max_len] True past the context
    decode_max_len: int
    prefills: list[tuple[int, int, int, torch.Tensor]]  # (start, end, seq_len, block ids)
    # For a prefill kernel: the batch rows of the step's prefill chunks.
    prefill_rows: torch.Tensor | None = None
    # For a decode kernel: the decoding requests' rows of the block table and
    # their context lengths (the metadata's own tensors when every request
    # decodes, so a pure decode step copies nothing).
    decode_block_table: torch.Tensor | None = None
    decode_seq_lens: torch.Tensor | None = None


def _plan(metadata: AttentionMetadata, block_size: int, for_kernel: bool = False) -> _StepPlan:
    qsl = metadata.query_start_loc_cpu
    query_lens = qsl[1:] - qsl[:-1]
    seq_lens = metadata.seq_lens_cpu
    device = metadata.block_table.device
    rows_cpu = torch.nonzero(query_lens == 1).flatten()
    tokens = ids = padding = table = lens = None
    max_len = 0
    if for_kernel and rows_cpu.numel():
        num_reqs = metadata.num_reqs
        if rows_cpu.numel() == num_reqs:
            table = metadata.block_table[:num_reqs]
            lens = metadata.seq_lens[:num_reqs]
            tokens = metadata.query_start_loc[:num_reqs].long()
        else:
            rows = rows_cpu.to(device)
            table = metadata.block_table[rows]
            lens = metadata.seq_lens[rows]
            tokens = qsl[rows_cpu].long().to(device)
    elif rows_cpu.numel():
        rows = rows_cpu.to(device)
        tokens = qsl[rows_cpu].to(device)
        max_len = int(seq_lens[rows_cpu].max())
        used = -(-max_len // block_size)
        ids = metadata.block_table[rows, :used].reshape(-1).long()
        positions = torch.arange(max_len, device=device)
        padding = positions[None, :] >= metadata.seq_lens[rows][:, None]
    prefills = []
    prefill_rows = torch.nonzero(query_lens > 1).flatten()
    for row in prefill_rows.tolist():
        seq_len = int(seq_lens[row])
        used = -(-seq_len // block_size)
        block_ids = metadata.block_table[row, :used].long()
        prefills.append((int(qsl[row]), int(qsl[row + 1]), seq_len, block_ids))
    return _StepPlan(
        decode_tokens=tokens,
        decode_block_ids=ids,
        decode_padding=padding,
        decode_max_len=max_len,
        prefills=prefills,
        prefill_rows=prefill_rows if prefills else None,
        decode_block_table=table,
        decode_seq_lens=lens,
    )


# decode_op(out, query, kv_cache, block_table, seq_lens, token_index, scale)
DecodeOp = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float],
    None,
]


# prefill_op(out, query, kv_cache, block_table, seq_lens, query_start_loc, rows, scale)
PrefillOp = Callable[
    [
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        float,
    ],
    None,
]
# cache_op(key, value, kv_cache, slot_mapping)
CacheOp = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
PREFILL_KERNEL_BLOCK_SIZE = 16
PREFILL_KERNEL_HEAD_SIZES = (64, 128)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(
        self,
        decode_op: DecodeOp | None = None,
        prefill_op: PrefillOp | None = None,
        cache_op: CacheOp | None = None,
    ) -> None:
        """`decode_op`, `prefill_op`, `cache_op`: kernels for the step's
        decodes, prefill chunks and cache write (the CPU's C++ ones); None
        does each in torch. The prefill kernel takes 16-position blocks and
        head sizes 64 and 128; other shapes stay on the torch path."""
        self.decode_op = decode_op
        self.prefill_op = prefill_op
        self.cache_op: CacheOp = cache_op or reshape_and_cache_ref
        self._plan_for: tuple[AttentionMetadata, int] | None = None
        self._plan: _StepPlan | None = None

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        n = metadata.num_actual_tokens
        if n != key.shape[0]:
            key, value = key[:n], value[:n]
        self.cache_op(key, value, kv_cache, metadata.slot_mapping)
        out = torch.empty_like(query)
        # All layers of a step share one metadata object: plan once per step.
        # (Holding the key keeps the object alive, so `is` cannot be fooled
        # by a new metadata at a recycled address.)
        key_ = self._plan_for
        if key_ is None or key_[0] is not metadata or key_[1] != kv_cache.shape[2]:
            self._plan = _plan(metadata, kv_cache.shape[2], self.decode_op is not None)
            self._plan_for = (metadata, kv_cache.shape[2])
        plan = self._plan
        if plan.decode_tokens is not None and self.decode_op is not None:
            self.decode_op(
                out,
                query,
                kv_cache,
                plan.decode_block_table,
                plan.decode_seq_lens,
                plan.decode_tokens,
                scale,
            )
        elif plan.decode_tokens is not None:
            self._decode(query, kv_cache, plan, scale, out)
        if plan.prefill_rows is not None and self._prefill_kernel_fits(kv_cache):
            self.prefill_op(
                out,
                query,
                kv_cache,
                metadata.block_table,
                metadata.seq_lens,
                metadata.query_start_loc,
                plan.prefill_rows,
                scale,
            )
        else:
            for start, end, seq_len, block_ids in plan.prefills:
                self._prefill(query[start:end], kv_cache, block_ids, seq_len, scale, out[start:end])
        return out

    def _prefill_kernel_fits(self, kv_cache: torch.Tensor) -> bool:
        return (
            self.prefill_op is not None
            and kv_cache.shape[2] == PREFILL_KERNEL_BLOCK_SIZE
            and kv_cache.shape[4] in PREFILL_KERNEL_HEAD_SIZES
        )

    @staticmethod
    def _decode(query, kv_cache, plan: _StepPlan, scale, out) -> None:
        tokens = plan.decode_tokens
        r = tokens.shape[0]
        k, v = _gather_blocks(kv_cache, plan.decode_block_ids, r, plan.decode_max_len)
        num_kv_heads, head_size = k.shape[1], query.shape[-1]
        # Query heads grouped by the KV head they share (head h reads KV head
        # h // group, as transformers' repeat_kv), so GQA needs no copies of
        # K/V per query head. Two batched matmuls beat SDPA here: with a
        # padding mask and GQA, SDPA on the CPU falls back to its unfused
        # path (measured 4x slower in float32). K and V are made contiguous
        # as [R, Hkv, L, D] first: a plain copy, whereas an einsum over the
        # strided gather view copies them transposed to [R, Hkv, D, L], 5-25x
        # slower (measured 1.0 ms against 0.04 ms per layer at 16 x 270 tokens
        # in bf16). A cache in another dtype (kv_cache_dtype) is
        # converted in the same copy.
        k = k.to(query.dtype, memory_format=torch.contiguous_format)
        v = v.to(query.dtype, memory_format=torch.contiguous_format)
        q = query[tokens].view(r, num_kv_heads, -1, head_size)
        scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(scale)
        scores.masked_fill_(plan.decode_padding[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        out[tokens] = torch.matmul(probs, v).reshape(r, -1, head_size)

    @staticmethod
    def _prefill(query, kv_cache, block_ids, seq_len, scale, out) -> None:
        q_len = query.shape[0]
        k, v = _gather_blocks(kv_cache, block_ids, 1, seq_len)
        k, v = k.to(query.dtype), v.to(query.dtype)
        q = query.transpose(0, 1).unsqueeze(0)  # [1, Hq, q_len, D]
        if q_len == seq_len:
            o = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            # Query i sits at absolute position seq_len - q_len + i and sees
            # every key up to and including that position.
            offset = seq_len - q_len
            qpos = torch.arange(q_len, device=query.device)[:, None] + offset
            kpos = torch.arange(seq_len, device=query.device)[None, :]
            mask = kpos <= qpos
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=scale, enable_gqa=True
            )
        out.copy_(o.squeeze(0).transpose(0, 1))
