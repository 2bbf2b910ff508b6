"""Linear layers on the CPU with oneDNN-prepacked weights (issue 13).

`F.linear` on the CPU hands a plain row-major weight to oneDNN (bf16) or MKL
(float32) on every call, and oneDNN reorders it into its blocked layout each
time. Reordering once at load time and calling oneDNN's linear on the packed
weight (what inductor's weight freezing does) measured, for SmolLM2-135M's 120
projections: bf16 28.8 -> 13.3 ms at 1 token, float32 99.6 -> 49.0 ms at 16
tokens and 1821 -> 776 ms at 512 tokens (1 thread, 2026-11-23). In bf16 the
packed call gives the same bits as `F.linear`; in float32 oneDNN's kernel
replaces MKL's sgemm (differences at rounding level).

The packed weight replaces the plain one (whose storage is freed, so memory
stays flat); the layers' `packed_weight` attribute is None wherever this is
not used (CUDA, `--no-fused-kernels`, a torch build without oneDNN).
"""

from __future__ import annotations

import torch
from torch import nn

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def available(dtype: torch.dtype, device: torch.device) -> bool:
    """True where prepacked oneDNN linears can run: the CPU, a torch built
    with oneDNN, float32, or bfloat16 on a CPU oneDNN runs it natively on."""
    if device.type != "cpu" or dtype not in PACKABLE_DTYPES:
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack(weight: torch.Tensor, batch_hint: int) -> torch.Tensor:
    """`weight` ([out, in]) reordered into oneDNN's layout for inputs of
    about `batch_hint` rows (any number of rows still works)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W^T (+ bias) with a weight from `pack`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack_model(model: nn.Module, batch_hint: int) -> int:
    """Pack every linear layer's weight and the LM head's; returns how many
    were packed. The linear layers' plain weights are freed; the LM head's
    is kept, since a tied LM head shares it with the token embedding."""
    from pagoda.runtime.layers.embedding import ParallelLMHead
    from pagoda.runtime.layers.linear import LinearBase

    count = 0
    for module in model.modules():
        if isinstance(module, LinearBase):
            module.packed_weight = pack(module.weight, batch_hint)
            module.weight.data = module.weight.data.new_empty(0)
            count += 1
        elif isinstance(module, ParallelLMHead):
            module.packed_weight = pack(module.weight, batch_hint)
            count += 1
    return count
