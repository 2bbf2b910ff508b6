"""Fused RMSNorm, optionally fused with the residual add before it.

One program per row keeps the whole row in registers: the add, the sum of
squares and the scaling read x (and the residual) from memory once and write
once, where the unfused torch path makes four passes. Rounding mirrors
transformers' LlamaRMSNorm (normalise in float32, round to the input dtype,
then multiply by the weight) so greedy tokens match it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    out_ptr,
    x_ptr,
    residual_ptr,
    residual_out_ptr,
    weight_ptr,
    stride_out,
    stride_x,
    stride_res,
    stride_res_out,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_res + offs, mask=mask, other=0.0)
        # The residual stream lives in the model dtype: round the sum once.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + row * stride_res_out + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / hidden + eps)
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + row * stride_out + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=mask
    )


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton launch of `rms_norm` (see `pagoda.kernels.ops`)."""
    hidden = x.shape[-1]
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if residual is not None:
        r2 = _rows(residual)
        res_out = torch.empty_like(out)
    else:
        r2 = res_out = x2  # unused when HAS_RESIDUAL is False
    if rows > 0:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(rows,)](
            out,
            x2,
            r2,
            res_out,
            weight,
            out.stride(0),
            x2.stride(0),
            r2.stride(0),
            res_out.stride(0),
            hidden,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=min(16, max(1, block // 512)),
        )
    out = out.view(x.shape)
    return out if residual is None else (out, res_out.view(x.shape))
