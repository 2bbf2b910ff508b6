"""Linear layers for tensor parallelism (Megatron-LM's split, as vLLM has it).

Each layer knows how its weight is split over the ranks of its
`TensorParallelGroup` and loads its own shard (`weight_loader`, which reads
only that shard of a lazy safetensors tensor). Column-parallel layers split
the output features and need no communication; the row-parallel layer that
follows splits the input features and all-reduces its partial sums. A
transformer block therefore costs two all-reduces (after attention's output
projection and after the MLP's down projection). Fused layers (QKV, gate-up)
load each checkpoint tensor into its slice of the fused weight. LoRA wraps
these layers: each keeps the `input_size`/`output_size` of its local shard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.distributed.parallel_state import TensorParallelGroup
from pagoda.runtime.layers import packed_linear
from pagoda.runtime.model_loader.weights import Weight, copy_weight, shard
from torch import nn


class LinearBase(nn.Module):
    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        tp: TensorParallelGroup | None = None,
    ):
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.tp = tp or TensorParallelGroup.single()
        self.tp_rank = self.tp.rank
        self.tp_size = self.tp.world_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    # The weight packed for a CPU linear kernel (`packed_linear.pack_model`),
    # which then replaces `weight`; None: `weight` is used as is.
    packed_weight: packed_linear.PackedWeight | None = None

    def weight_loader(self, param: nn.Parameter, loaded: Weight, shard_id=None) -> None:
        raise NotImplementedError

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x @ W^T (+ bias) on this rank's weight, packed or plain."""
        if self.packed_weight is not None:
            return packed_linear.linear(x, self.packed_weight, bias)
        return F.linear(x, self.weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


class ReplicatedLinear(LinearBase):
    """The full weight on every rank."""

    def weight_loader(self, param: nn.Parameter, loaded: Weight, shard_id=None) -> None:
        copy_weight(param.data, loaded)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks: y_local = x @ W[rank rows]^T."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        tp: TensorParallelGroup | None = None,
    ):
        tp = tp or TensorParallelGroup.single()
        assert output_size % tp.world_size == 0, "output size must divide by tp_size"
        super().__init__(input_size, output_size // tp.world_size, bias, tp)

    def weight_loader(self, param: nn.Parameter, loaded: Weight, shard_id=None) -> None:
        size = param.shape[0]
        copy_weight(param.data, shard(loaded, 0, size * self.tp_size, self.tp_rank, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input fused into one matmul
    (gate and up of the MLP). `shard_id` is the index of the part."""

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = False,
        tp: TensorParallelGroup | None = None,
    ):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, tp)

    def weight_loader(self, param: nn.Parameter, loaded: Weight, shard_id=None) -> None:
        assert shard_id is not None, "a fused layer loads one part at a time"
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        part = param.data.narrow(0, offset, size)
        copy_weight(part, shard(loaded, 0, self.output_sizes[shard_id], self.tp_rank, size))


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
        tp: TensorParallelGroup | None = None,
    ):
        tp = tp or TensorParallelGroup.single()
        tp_size = tp.world_size
        self.head_size = head_size
        self.num_heads = num_heads // tp_size
        self.num_kv_heads = max(1, num_kv_heads // tp_size)
        self.kv_replicas = max(1, tp_size // num_kv_heads)
        self.total_num_heads = num_heads
        self.total_num_kv_heads = num_kv_heads
        total = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp_size
        super().__init__(hidden_size, total, bias, tp)

    def weight_loader(self, param: nn.Parameter, loaded: Weight, shard_id=None) -> None:
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
        copy_weight(param.data.narrow(0, offset, size), shard(loaded, 0, full, rank, size))


class RowParallelLinear(LinearBase):
    """Input features split across ranks; the partial sums are all-reduced
    (a no-op at tp_size 1, where this is the only rank)."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        tp: TensorParallelGroup | None = None,
    ):
        tp = tp or TensorParallelGroup.single()
        assert input_size % tp.world_size == 0, "input size must divide by tp_size"
        super().__init__(input_size // tp.world_size, output_size, bias, tp)

    def weight_loader(self, param: nn.Parameter, loaded: Weight, shard_id=None) -> None:
        if param.dim() == 1:  # the bias is added once, after the reduction
            copy_weight(param.data, loaded)
            return
        size = param.shape[1]
        copy_weight(param.data, shard(loaded, 1, size * self.tp_size, self.tp_rank, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.matmul(x, self.bias)
        # Each rank holds a slice of the input features: sum the partial
        # products, then add the bias once.
        out = self.tp.all_reduce(self.matmul(x))
        return out if self.bias is None else out + self.bias
