"""Layers that have a Triton kernel and a torch twin (`pagoda.kernels.ops`).

Which runs is decided once, when the model is loaded, not per call: the
Triton kernels on CUDA, the C++ kernels of `pagoda.kernels.cpu` on the CPU
where they build (RMSNorm, RoPE, SiLU-and-mul), the twins elsewhere and under
`--no-fused-kernels`.
The twin in `pagoda.kernels.reference` is the only torch implementation of
each op, so the CPU path and the kernels' test oracle cannot drift apart.
"""

from __future__ import annotations

from torch import nn


class CustomOp(nn.Module):
    """A layer whose forward dispatches to a kernel or its twin (vLLM's name)."""

    # False until `set_triton_kernels` says otherwise: a model built on the
    # CPU runs the twins whatever TRITON_INTERPRET says.
    use_triton: bool = False
    # True once `set_cpu_kernels` found the C++ CPU kernels built.
    use_cpu_kernels: bool = False


def set_triton_kernels(model: nn.Module, enabled: bool) -> int:
    """Route every CustomOp of `model` to its Triton kernel (or to its twin);
    returns how many layers were set."""
    return _set_on_custom_ops(model, "use_triton", enabled)


def set_cpu_kernels(model: nn.Module, enabled: bool) -> int:
    """Route every CustomOp of `model` that has a C++ CPU kernel to it (or
    back to its twin); returns how many layers were set."""
    return _set_on_custom_ops(model, "use_cpu_kernels", enabled)


def _set_on_custom_ops(model: nn.Module, flag: str, enabled: bool) -> int:
    count = 0
    for module in model.modules():
        if isinstance(module, CustomOp):
            setattr(module, flag, enabled)
            count += 1
    return count
