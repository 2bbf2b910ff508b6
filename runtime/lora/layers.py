"""Linear layers with LoRA slots: the base projection plus, for every token
whose request runs an adapter, that adapter's `B @ A` delta.

Each wrapped layer keeps `max_loras` slots of stacked weights (layout in
`pagoda.kernels.lora`): a fused layer's slot holds one rank-wide band per
sub-projection (q, k, v or gate, up), with B block-diagonal so each band
only feeds its own outputs. Tensor parallelism shards the slots as it shards
the base weight: column-parallel layers keep A whole and B's rows for their
outputs; row-parallel layers keep A's columns for their inputs, add the
delta to their partial sum, and reduce once.

The forward costs nothing extra while the step's `LoRABatch` has no adapter
token: the mapping is None and the base layer runs alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pagoda.kernels import ops
from pagoda.runtime.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from torch import nn


@dataclass
class LoRABatch:
    """The current step's token -> slot mapping, shared by every LoRA layer
    of one model and set by the model runner once per step (None: no token
    of this step uses an adapter)."""

    token_slots: torch.Tensor | None = None
    use_triton: bool = False


class LinearWithLoRA(nn.Module):
    """A base linear layer plus `num_slots` LoRA slots of rank `max_rank`
    for each of its sub-projections (`shard_ids`, in output order)."""

    def __init__(
        self,
        base: LinearBase,
        batch: LoRABatch,
        num_slots: int,
        max_rank: int,
        shard_ids: list,
    ):
        super().__init__()
        self.base = base
        self.batch = batch
        self.max_rank = max_rank
        self.shard_ids = shard_ids
        self.slot_width = max_rank * len(shard_ids)
        dtype, device = base.weight.dtype, base.weight.device
        in_f, out_f = base.weight.shape[1], base.weight.shape[0]
        self.register_buffer(
            "lora_a", torch.zeros(num_slots * self.slot_width, in_f, dtype=dtype, device=device)
        )
        self.register_buffer(
            "lora_b", torch.zeros(out_f, num_slots * self.slot_width, dtype=dtype, device=device)
        )

    def _add_lora(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return ops.add_lora(
            y,
            x,
            self.lora_a,
            self.lora_b,
            self.batch.token_slots,
            self.slot_width,
            triton=self.batch.use_triton,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.batch.token_slots is None:
            return y
        return self._add_lora(y, x)

    def clear_slot(self, slot: int) -> None:
        band = slice(slot * self.slot_width, (slot + 1) * self.slot_width)
        self.lora_a[band] = 0
        self.lora_b[:, band] = 0

    @torch.no_grad()
    def set_slot(self, slot: int, weights: dict) -> None:
        """Load one adapter's weights for this layer into `slot`.

        `weights` maps a shard id (as `shard_ids` names them) to the
        checkpoint's whole (A [r, in], B [out, r]); this rank keeps its shard
        through the base layer's own weight loader. Sub-projections the
        adapter does not target stay zero.
        """
        self.clear_slot(slot)
        for j, shard_id in enumerate(self.shard_ids):
            if shard_id not in weights:
                continue
            a, b = weights[shard_id]
            r = a.shape[0]
            start = slot * self.slot_width + j * self.max_rank
            self.lora_a[start : start + r] = self._shard_a(a)
            self.lora_b[:, start : start + r] = self._shard_b(b, shard_id)

    def _shard_a(self, a: torch.Tensor) -> torch.Tensor:
        return a  # column-parallel: every rank reads the whole input

    def _shard_b(self, b: torch.Tensor, shard_id) -> torch.Tensor:
        # The base loader places B's rows where the base weight's outputs go.
        out = nn.Parameter(
            torch.zeros(self.lora_b.shape[0], b.shape[1], dtype=self.lora_b.dtype),
            requires_grad=False,
        )
        self.base.weight_loader(out, b, shard_id)
        return out.data.to(self.lora_b.device)


class RowParallelLinearWithLoRA(LinearWithLoRA):
    """Row-parallel: A is split over the inputs like the base weight; the
    delta joins the partial sum before the one all-reduce."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch.token_slots is None:
            return self.base(x)
        base = self.base
        y = self._add_lora(base.matmul(x), x)
        y = base.tp.all_reduce(y)
        return y if base.bias is None else y + base.bias

    def _shard_a(self, a: torch.Tensor) -> torch.Tensor:
        out = nn.Parameter(
            torch.zeros(a.shape[0], self.lora_a.shape[1], dtype=self.lora_a.dtype),
            requires_grad=False,
        )
        self.base.weight_loader(out, a, None)
        return out.data.to(self.lora_a.device)

    def _shard_b(self, b: torch.Tensor, shard_id) -> torch.Tensor:
        return b  # every rank produces every output


# HF module name -> (attribute path in a decoder layer, shard id in the fused layer)
LORA_TARGETS: dict[str, tuple[str, object]] = {
    "q_proj": ("self_attn.qkv_proj", "q"),
    "k_proj": ("self_attn.qkv_proj", "k"),
    "v_proj": ("self_attn.qkv_proj", "v"),
    "o_proj": ("self_attn.o_proj", None),
    "gate_proj": ("mlp.gate_up_proj", 0),
    "up_proj": ("mlp.gate_up_proj", 1),
    "down_proj": ("mlp.down_proj", None),
}


def wrap_with_lora(base: nn.Module, batch: LoRABatch, num_slots: int, max_rank: int):
    """The LoRA wrapper for a base projection of a decoder layer."""
    if isinstance(base, QKVParallelLinear):
        return LinearWithLoRA(base, batch, num_slots, max_rank, ["q", "k", "v"])
    if isinstance(base, MergedColumnParallelLinear):
        return LinearWithLoRA(base, batch, num_slots, max_rank, [0, 1])
    if isinstance(base, RowParallelLinear):
        return RowParallelLinearWithLoRA(base, batch, num_slots, max_rank, [None])
    raise TypeError(f"no LoRA wrapper for {type(base).__name__}")
