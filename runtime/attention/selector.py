"""Pick the attention backend: Triton on CUDA, torch elsewhere, unless asked."""

from __future__ import annotations

import torch
from pagoda.runtime.attention.backend import AttentionBackend


def select_backend(name: str, device: torch.device) -> AttentionBackend:
    if name == "auto":
        name = "triton" if device.type == "cuda" and _triton_available() else "torch"
    if name == "torch":
        from pagoda.runtime.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
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
