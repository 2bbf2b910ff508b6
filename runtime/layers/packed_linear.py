"""Linear layers on the CPU on weights packed once at load time.

`F.linear` on the CPU hands a plain row-major weight to oneDNN (bf16) or MKL
(float32) on every call, and oneDNN reorders it into its blocked layout each
time. Packing once at load time is what inductor's weight freezing does.
Two kernels read a packed weight:

- `pagoda` (`kernels/cpu/linear.cpp`), where the C++ extension builds and
  the CPU has AVX-512 or AVX2 with FMA (float32 and bf16; bf16 as pair dot
  products on AVX512-BF16, widened to float32 elsewhere, and widened in
  registers there too from the row count where this machine measured that
  faster, `pagoda.kernels.cpu.bf16_widen_rows`): at the 1-16 rows of
  a decode step it reads the weight 1.2-2.2x faster than oneDNN's call, and
  at 256-512 rows it is within 10% of it (docs/benchmarks.md). A model whose
  linears all run here can be replayed as a CPU graph; oneDNN's are torch
  ops the graph cannot record.
- `onednn` (`torch.ops.mkldnn`'s prepacked linear) everywhere else torch
  has oneDNN: measured against `F.linear` on SmolLM2's 120 projections, bf16
  28.8 -> 13.3 ms at 1 token, float32 1821 -> 776 ms at 512 tokens.

The packed weight replaces the plain one (whose storage is freed, so memory
stays flat); the layers' `packed_weight` is None wherever this is not used
(CUDA, `--no-fused-kernels`, a torch without oneDNN and no extension).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A linear layer's weight in the layout of the kernel that reads it."""

    data: torch.Tensor
    out_features: int
    kernel: str  # "pagoda" or "onednn"
    # pagoda's `packed_linear(x, data, out_features, bias, widen_from_rows)`,
    # looked up once.
    op: Callable | None = None
    # bf16 calls of at least this many rows run as float32 FMAs (0: never):
    # `pagoda.kernels.cpu.bf16_widen_rows`, measured once per machine.
    widen_rows: int = 0


def _pagoda_ops(dtype: torch.dtype) -> tuple[Callable, Callable] | None:
    from pagoda.kernels import cpu as cpu_kernels

    return cpu_kernels.linear_ops(dtype)


def onednn_available(dtype: torch.dtype) -> bool:
    """Whether torch's oneDNN runs packed linears in `dtype` on this CPU."""
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


def available(dtype: torch.dtype, device: torch.device) -> bool:
    """True where packed linears can run: the CPU, float32 or bfloat16, and
    either kernel (oneDNN's bf16 needs a CPU that runs bf16 natively)."""
    if device.type != "cpu" or dtype not in PACKABLE_DTYPES:
        return False
    return _pagoda_ops(dtype) is not None or onednn_available(dtype)


def pack(weight: torch.Tensor, batch_hint: int, kernel: str | None = None) -> PackedWeight:
    """`weight` ([out, in]) packed for `kernel` (default: `pagoda` where it
    runs, else `onednn`, whose layout is chosen for inputs of about
    `batch_hint` rows; any number of rows still works with either)."""
    weight = weight.detach()
    ops = _pagoda_ops(weight.dtype) if kernel in (None, "pagoda") else None
    if ops is not None:
        from pagoda.kernels import cpu as cpu_kernels

        widen_rows = cpu_kernels.bf16_widen_rows() if weight.dtype == torch.bfloat16 else 0
        return PackedWeight(
            ops[0](weight.contiguous()), weight.shape[0], "pagoda", ops[1], widen_rows
        )
    if kernel == "pagoda":
        raise RuntimeError(f"no pagoda packed linear for {weight.dtype} on this machine")
    data = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
    return PackedWeight(data, weight.shape[0], "onednn")


def linear(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W^T (+ bias) with a weight from `pack`; x is [..., in]."""
    if packed.op is None:
        return torch.ops.mkldnn._linear_pointwise(x, packed.data, bias, "none", [], "")
    if x.dim() == 2 and x.stride(1) == 1:  # the model's activations: no reshape
        return packed.op(x, packed.data, packed.out_features, bias, packed.widen_rows)
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = packed.op(rows, packed.data, packed.out_features, bias, packed.widen_rows)
    return out.view(*x.shape[:-1], packed.out_features)


def pack_model(model: nn.Module, batch_hint: int) -> int:
    """Pack every linear layer's weight and the LM head's; returns how many
    were packed. The plain weights are freed, except a tied LM head's, which
    the token embedding shares (an untied one is the size of the vocabulary
    times the hidden size: 1 GiB in bf16 for Llama 3 8B)."""
    from pagoda.runtime.layers.embedding import ParallelLMHead, VocabParallelEmbedding
    from pagoda.runtime.layers.linear import LinearBase

    embeddings = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)
    }
    count = 0
    for module in model.modules():
        if isinstance(module, LinearBase):
            module.packed_weight = pack(module.weight, batch_hint)
            module.weight.data = module.weight.data.new_empty(0)
            count += 1
        elif isinstance(module, ParallelLMHead):
            module.packed_weight = pack(module.weight, batch_hint)
            if id(module.weight) not in embeddings:
                module.weight.data = module.weight.data.new_empty(0)
            count += 1
    return count
