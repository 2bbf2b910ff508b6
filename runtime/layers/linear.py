"""Linear layers written for tensor parallelism.

Each layer knows how its weight is split across `tp_size` ranks and loads its
own shard (`weight_loader`), so turning on tensor parallelism means passing a
rank and size and adding the collective in `RowParallelLinear`, not rewriting
the model. Fused layers (QKV, gate-up) load each checkpoint tensor into its
slice of the fused weight. LoRA wraps these layers later: each keeps the
`input_size`/`output_size` of its local shard for that reason.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LinearBase(nn.Module):
    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        tp_rank: int = 0,
        tp_size: int = 1,
    ):
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def _copy(param: torch.Tensor, loaded: torch.Tensor) -> None:
    if param.shape != loaded.shape:
        raise ValueError(
            f"weight shape mismatch: expected {tuple(param.shape)}, got {tuple(loaded.shape)}"
        )
    param.copy_(loaded)


def _shard(loaded: torch.Tensor, dim: int, full: int, rank: int, size: int) -> torch.Tensor:
    """This rank's `size` slice of the checkpoint's whole tensor along `dim`.

    The whole tensor must have `full` entries there: narrow() alone would
    truncate a larger tensor silently, or fail obscurely on a smaller one."""
    if loaded.shape[dim] != full:
        raise ValueError(
            f"weight shape mismatch: expected {full} along dim {dim}, got {tuple(loaded.shape)}"
        )
    return loaded.narrow(dim, rank * size, size)


class ReplicatedLinear(LinearBase):
    """The full weight on every rank."""

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        _copy(param.data, loaded)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks: y_local = x @ W[rank rows]^T."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, tp_rank=0, tp_size=1):
        assert output_size % tp_size == 0, "output size must divide by tp_size"
        super().__init__(input_size, output_size // tp_size, bias, tp_rank, tp_size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        size = param.shape[0]
        _copy(param.data, _shard(loaded, 0, size * self.tp_size, self.tp_rank, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input fused into one matmul
    (gate and up of the MLP). `shard_id` is the index of the part."""

    def __init__(self, input_size: int, output_sizes: list[int], bias=False, tp_rank=0, tp_size=1):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, tp_rank, tp_size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        assert shard_id is not None, "a fused layer loads one part at a time"
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        part = param.data.narrow(0, offset, size)
        _copy(part, _shard(loaded, 0, self.output_sizes[shard_id], self.tp_rank, size))


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V projections fused; heads are split across ranks (KV heads
    are replicated when there are fewer of them than ranks)."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        tp_rank: int = 0,
        tp_size: int = 1,
    ):
        self.head_size = head_size
        self.num_heads = num_heads // tp_size
        self.num_kv_heads = max(1, num_kv_heads // tp_size)
        self.kv_replicas = max(1, tp_size // num_kv_heads)
        self.total_num_heads = num_heads
        self.total_num_kv_heads = num_kv_heads
        total = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp_size
        super().__init__(hidden_size, total, bias, tp_rank, tp_size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        kv_full = self.total_num_kv_heads * self.head_size
        if shard_id == "q":
            offset, size, rank = 0, q_size, self.tp_rank
            full = self.total_num_heads * self.head_size
        elif shard_id == "k":
            offset, size, rank = q_size, kv_size, self.tp_rank // self.kv_replicas
            full = kv_full
        elif shard_id == "v":
            offset, size, rank = q_size + kv_size, kv_size, self.tp_rank // self.kv_replicas
            full = kv_full
        else:
            raise ValueError(f"QKV shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        _copy(param.data.narrow(0, offset, size), _shard(loaded, 0, full, rank, size))


class RowParallelLinear(LinearBase):
    """Input features split across ranks; the partial sums are all-reduced
    (a no-op at tp_size 1, where this is the only rank)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, tp_rank=0, tp_size=1):
        assert input_size % tp_size == 0, "input size must divide by tp_size"
        super().__init__(input_size // tp_size, output_size, bias, tp_rank, tp_size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if param.dim() == 1:  # the bias is added once, after the reduction
            _copy(param.data, loaded)
            return
        size = param.shape[1]
        _copy(param.data, _shard(loaded, 1, size * self.tp_size, self.tp_rank, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.linear(x, self.weight, self.bias)
        raise NotImplementedError("tensor parallelism needs a process group (not built yet)")
