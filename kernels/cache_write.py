"""Cache write: scatter one step's new keys and values into the paged KV cache.

PagedAttention (Kwon et al., 2023) keeps each request's KV in fixed-size blocks
anywhere in one pool; the slot mapping turns token i of the step into its slot
`block_id * block_size + offset`. One program per token copies all kv heads of
that token's K and V row (num_kv_heads * head_size contiguous elements per
slot in the cache layout), so the write is coalesced on the cache side.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    cache_ptr,
    slot_mapping_ptr,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_c_kv,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    BLOCK_SIZE: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    # Padded tokens (CUDA-graph batches) carry slot -1 and must not write.
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, HEAD_PAD)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_SIZE)
    tok = token.to(tl.int64)
    k = tl.load(key_ptr + tok * stride_k_tok + h * stride_k_head + d, mask=mask)
    v = tl.load(value_ptr + tok * stride_v_tok + h * stride_v_head + d, mask=mask)
    dst = cache_ptr + block * stride_c_block + offset * stride_c_slot + h * stride_c_head + d
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_c_kv, v.to(cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton launch of `reshape_and_cache` (see `pagoda.kernels.ops`)."""
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    assert key.stride(-1) == 1 and value.stride(-1) == 1, "head dim must be contiguous"
    assert kv_cache.stride(-1) == 1 and kv_cache.stride(-2) == head_size
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        kv_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        BLOCK_SIZE=block_size,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_SIZE=head_size,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_PAD=triton.next_power_of_2(head_size),
        num_warps=4,
    )
