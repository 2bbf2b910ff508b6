"""Pick the attention backend: Triton on CUDA, torch elsewhere, unless asked."""

from __future__ import annotations

import torch
from pagoda.runtime.attention.backend import AttentionBackend


def select_backend(name: str, device: torch.device, cpu_kernels: bool = False) -> AttentionBackend:
    """The backend called `name` ("auto": Triton on CUDA, torch elsewhere).
    With `cpu_kernels`, the torch backend on the CPU writes the cache and
    computes decodes and prefill chunks with the C++ kernels where they build
    (`pagoda.kernels.cpu`)."""
    if name == "auto":
        name = "triton" if device.type == "cuda" and _triton_available() else "torch"
    if name == "torch":
        from pagoda.runtime.attention.torch_backend import TorchAttentionBackend

        decode_op = prefill_op = cache_op = None
        if cpu_kernels and device.type == "cpu":
            from pagoda.kernels import cpu

            decode_op, prefill_op = cpu.decode_attention_op(), cpu.prefill_attention_op()
            cache_op = cpu.reshape_and_cache_op()
        return TorchAttentionBackend(decode_op, prefill_op, cache_op)
    if name == "triton":
        from pagoda.runtime.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"attention_backend must be 'auto', 'torch' or 'triton', got {name!r}")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    try:
        import pagoda.runtime.attention.triton_backend  # noqa: F401
    except ImportError:
        return False
    return True
