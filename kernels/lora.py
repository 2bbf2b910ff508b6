"""Multi-LoRA shrink and expand: every token of a batch through its own adapter.

A layer's adapters live stacked in one slot layout: slot `s` owns rows
`s*R:(s+1)*R` of `lora_a` [L*R, in] and the same columns of `lora_b`
[out, L*R] (R is the slot's width: the rank, times the sub-projections of a
fused layer). `token_slots[t]` is token t's slot, -1 for the base model.

- shrink: `s[t] = lora_a[slot(t)] @ x[t]` -> [T, R] (float32), zero for -1;
- expand: `y[t] += lora_b[:, slot(t)] @ s[t]`, nothing for -1.

One program per (token, block of outputs), each reading only its token's
slot: the gather-matrix-vector form of Punica's BGMV (Chen et al., 2023),
with no per-request or per-adapter loop and no gathered copy of the weights.
The torch twin (`reference.lora_shrink_ref` / `lora_expand_ref`) computes
the same with two dense matmuls over every slot and a mask, which is what the
CPU runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _shrink_kernel(
    x_ptr,
    a_ptr,
    slots_ptr,
    out_ptr,
    in_features,
    slot_width,
    stride_x,
    stride_a,
    stride_out,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    r_block = tl.program_id(1)
    slot = tl.load(slots_ptr + t)
    rows = r_block * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < slot_width
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    if slot >= 0:
        a_rows = slot.to(tl.int64) * slot_width + rows
        for k in range(0, in_features, BLOCK_K):
            cols = k + tl.arange(0, BLOCK_K)
            col_mask = cols < in_features
            xv = tl.load(x_ptr + t * stride_x + cols, mask=col_mask, other=0.0).to(tl.float32)
            a = tl.load(
                a_ptr + a_rows[:, None] * stride_a + cols[None, :],
                mask=row_mask[:, None] & col_mask[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += tl.sum(a * xv[None, :], axis=1)
    tl.store(out_ptr + t * stride_out + rows, acc, mask=row_mask)


@triton.jit
def _expand_kernel(
    s_ptr,
    b_ptr,
    slots_ptr,
    y_ptr,
    out_features,
    slot_width,
    stride_s,
    stride_b,
    stride_y,
    BLOCK_O: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    o_block = tl.program_id(1)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        outs = o_block * BLOCK_O + tl.arange(0, BLOCK_O)
        out_mask = outs < out_features
        acc = tl.zeros((BLOCK_O,), dtype=tl.float32)
        for r in range(0, slot_width, BLOCK_R):
            rs = r + tl.arange(0, BLOCK_R)
            r_mask = rs < slot_width
            sv = tl.load(s_ptr + t * stride_s + rs, mask=r_mask, other=0.0)
            b_cols = slot.to(tl.int64) * slot_width + rs
            b = tl.load(
                b_ptr + outs[:, None] * stride_b + b_cols[None, :],
                mask=out_mask[:, None] & r_mask[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += tl.sum(b * sv[None, :], axis=1)
        y_ptrs = y_ptr + t * stride_y + outs
        y = tl.load(y_ptrs, mask=out_mask, other=0.0)
        tl.store(y_ptrs, (y.to(tl.float32) + acc).to(y.dtype), mask=out_mask)


def lora_shrink_triton(
    x: torch.Tensor, lora_a: torch.Tensor, token_slots: torch.Tensor, slot_width: int
) -> torch.Tensor:
    num_tokens, in_features = x.shape
    out = torch.empty(num_tokens, slot_width, dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return out
    x = x.contiguous()
    block_r = min(64, triton.next_power_of_2(slot_width))
    block_k = min(128, triton.next_power_of_2(in_features))
    grid = (num_tokens, triton.cdiv(slot_width, block_r))
    _shrink_kernel[grid](
        x,
        lora_a,
        token_slots,
        out,
        in_features,
        slot_width,
        x.stride(0),
        lora_a.stride(0),
        out.stride(0),
        BLOCK_R=block_r,
        BLOCK_K=block_k,
    )
    return out


def lora_expand_triton(
    s: torch.Tensor,
    lora_b: torch.Tensor,
    token_slots: torch.Tensor,
    slot_width: int,
    y: torch.Tensor,
) -> torch.Tensor:
    num_tokens, out_features = y.shape
    if num_tokens == 0:
        return y
    assert y.stride(1) == 1 and lora_b.stride(1) == 1, "expand writes rows of y in place"
    block_o = min(128, triton.next_power_of_2(out_features))
    block_r = min(64, triton.next_power_of_2(slot_width))
    grid = (num_tokens, triton.cdiv(out_features, block_o))
    _expand_kernel[grid](
        s,
        lora_b,
        token_slots,
        y,
        out_features,
        slot_width,
        s.stride(0),
        lora_b.stride(0),
        y.stride(0),
        BLOCK_O=block_o,
        BLOCK_R=block_r,
    )
    return y
