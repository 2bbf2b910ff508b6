"""Paged attention in plain torch: runs on any device and is the oracle the
Triton kernels are checked against.

Decodes (one query token) of the whole step are computed together: their
context is gathered from the paged cache through the block table into a
padded [requests, max_context] tensor, and two batched matmuls with a padding
mask compute their attention. Prefill chunks are
computed one request at a time (a step holds few of them), each with a causal
mask shifted by the tokens already cached before the chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.backend import AttentionBackend, AttentionMetadata


def write_kv_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter this step's K/V ([T, Hkv, D]) into the cache at their slots."""
    _, num_blocks, block_size, num_kv_heads, head_size = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_size)
    flat[0].index_copy_(0, slot_mapping, key)
    flat[1].index_copy_(0, slot_mapping, value)


def gather_kv(
    kv_cache: torch.Tensor, block_table: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the first `num_tokens` positions of each request's block
    table, as [R, Hkv, num_tokens, D] (strided views of one gathered copy)."""
    _, num_blocks, block_size, num_kv_heads, head_size = kv_cache.shape
    used = -(-num_tokens // block_size)
    ids = block_table[:, :used].reshape(-1).long()
    r = block_table.shape[0]
    # index_select over whole blocks seen as rows: about 10x faster on the
    # CPU than advanced indexing of kv_cache[:, blocks] (measured).
    rows = kv_cache.view(2, num_blocks, -1)
    k = rows[0].index_select(0, ids).view(r, used * block_size, num_kv_heads, head_size)
    v = rows[1].index_select(0, ids).view(r, used * block_size, num_kv_heads, head_size)
    return k[:, :num_tokens].transpose(1, 2), v[:, :num_tokens].transpose(1, 2)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

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
        write_kv_cache(key[:n], value[:n], kv_cache, metadata.slot_mapping)
        out = torch.empty_like(query)

        qsl = metadata.query_start_loc_cpu
        query_lens = qsl[1:] - qsl[:-1]
        seq_lens = metadata.seq_lens_cpu
        decode_rows = torch.nonzero(query_lens == 1).flatten()
        prefill_rows = torch.nonzero(query_lens > 1).flatten().tolist()

        if decode_rows.numel():
            self._decode(query, kv_cache, metadata, decode_rows, scale, out)
        for row in prefill_rows:
            start, end = int(qsl[row]), int(qsl[row + 1])
            self._prefill(
                query[start:end], kv_cache, metadata, row, int(seq_lens[row]), scale, out[start:end]
            )
        return out

    @staticmethod
    def _decode(query, kv_cache, metadata, rows_cpu, scale, out) -> None:
        tokens = metadata.query_start_loc_cpu[rows_cpu].to(query.device)
        rows = rows_cpu.to(query.device)
        seq_lens = metadata.seq_lens[rows]
        max_len = int(metadata.seq_lens_cpu[rows_cpu].max())
        k, v = gather_kv(kv_cache, metadata.block_table[rows], max_len)
        r, num_kv_heads = k.shape[0], k.shape[1]
        head_size = query.shape[-1]
        # Query heads grouped by the KV head they share (head h reads KV head
        # h // group, as transformers' repeat_kv), so GQA needs no copies of
        # K/V. Two batched matmuls beat SDPA here: with a padding mask and
        # GQA, SDPA on the CPU falls back to its unfused path (measured 4x
        # slower in float32).
        q = query[tokens].view(r, num_kv_heads, -1, head_size)
        scores = torch.einsum("rhgd,rhld->rhgl", q, k).float().mul_(scale)
        positions = torch.arange(max_len, device=query.device)
        padding = positions[None, :] >= seq_lens[:, None]
        scores.masked_fill_(padding[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        out[tokens] = torch.einsum("rhgl,rhld->rhgd", probs, v).reshape(r, -1, head_size)

    @staticmethod
    def _prefill(query, kv_cache, metadata, row, seq_len, scale, out) -> None:
        q_len = query.shape[0]
        k, v = gather_kv(kv_cache, metadata.block_table[row : row + 1], seq_len)
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
