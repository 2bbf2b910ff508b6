"""Rotary position embedding (RoPE, Su et al., 2021), neox style, in place.

Neox style rotates the two halves of the first rot_dim dims of each head:
(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), with cos/sin read from a
precomputed cache [max_pos, rot_dim] (cos | sin, vLLM's layout) at each
token's position. One program per token rotates all query and key heads, so
the cos/sin row is loaded once per token, and the tensors are updated in
place (no copies of Q and K).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    ptr,
    tok,
    stride_tok,
    stride_head,
    num_heads,
    cos,
    sin,
    HALF: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    h = tl.arange(0, HEADS_PAD)[:, None]
    i = tl.arange(0, HALF_PAD)[None, :]
    mask = (h < num_heads) & (i < HALF)
    base = ptr + tok * stride_tok + h * stride_head + i
    x1 = tl.load(base, mask=mask, other=0.0)
    x2 = tl.load(base + HALF, mask=mask, other=0.0)
    x1f = x1.to(tl.float32)
    x2f = x2.to(tl.float32)
    tl.store(base, (x1f * cos - x2f * sin).to(x1.dtype), mask=mask)
    tl.store(base + HALF, (x2f * cos + x1f * sin).to(x2.dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    positions_ptr,
    cache_ptr,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_cache,
    num_q_heads,
    num_k_heads,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + tok).to(tl.int64)
    i = tl.arange(0, HALF_PAD)
    cmask = i < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + i, mask=cmask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + i, mask=cmask, other=0.0).to(tl.float32)[
        None, :
    ]
    _rotate_heads(
        q_ptr, tok, stride_q_tok, stride_q_head, num_q_heads, cos, sin, HALF, Q_HEADS_PAD, HALF_PAD
    )
    _rotate_heads(
        k_ptr, tok, stride_k_tok, stride_k_head, num_k_heads, cos, sin, HALF, K_HEADS_PAD, HALF_PAD
    )


def rotary_embedding_triton(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> None:
    """Triton launch of `rotary_embedding` (see `pagoda.kernels.ops`)."""
    num_tokens = positions.shape[0]
    if num_tokens == 0:
        return
    assert query.stride(-1) == 1 and key.stride(-1) == 1, "head dim must be contiguous"
    assert cos_sin_cache.stride(-1) == 1
    half = cos_sin_cache.shape[-1] // 2
    _rotary_kernel[(num_tokens,)](
        query,
        key,
        positions,
        cos_sin_cache,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        cos_sin_cache.stride(0),
        query.shape[1],
        key.shape[1],
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
        Q_HEADS_PAD=triton.next_power_of_2(query.shape[1]),
        K_HEADS_PAD=triton.next_power_of_2(key.shape[1]),
        num_warps=4,
    )
