"""Checkpoint tensors as the weight loaders see them.

A loader may receive a whole tensor or a `LazyWeight` (a safetensors slice
not yet read): both have `.shape` and `.narrow(dim, start, length)`, so a
tensor-parallel rank reads only its own shard of a lazy checkpoint tensor
from disk, and `materialize` turns what is left into a tensor.
"""

from __future__ import annotations

from typing import Any

import torch


class LazyWeight:
    """One tensor of a safetensors file, read on demand (only the part asked for)."""

    def __init__(self, safe_slice: Any):
        self._slice = safe_slice
        self.shape = tuple(safe_slice.get_shape())

    def dim(self) -> int:
        return len(self.shape)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + length)
        return self._slice[tuple(index)]

    def materialize(self) -> torch.Tensor:
        return self._slice[:]


Weight = torch.Tensor | LazyWeight


def materialize(weight: Weight) -> torch.Tensor:
    return weight.materialize() if isinstance(weight, LazyWeight) else weight


def copy_weight(param: torch.Tensor, loaded: Weight) -> None:
    """Copy `loaded` into `param` (converting the dtype), refusing a shape
    mismatch with a message naming both shapes."""
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(
            f"weight shape mismatch: expected {tuple(param.shape)}, got {tuple(loaded.shape)}"
        )
    param.copy_(materialize(loaded))


def shard(loaded: Weight, dim: int, full: int, rank: int, size: int) -> Weight:
    """This rank's `size` slice along `dim` of the checkpoint's whole tensor.

    The whole tensor must have `full` entries there: narrow() alone would
    truncate a larger tensor silently, or fail obscurely on a smaller one."""
    if loaded.shape[dim] != full:
        raise ValueError(
            f"weight shape mismatch: expected {full} along dim {dim}, got {tuple(loaded.shape)}"
        )
    if size == full:
        return loaded
    return loaded.narrow(dim, rank * size, size)
