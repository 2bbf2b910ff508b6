"""The tensor-parallel group one worker belongs to, and its collectives.

Passed explicitly to every layer that needs it (no module-level "current
group", unlike vLLM's `get_tp_group()`): a model built with
`TensorParallelGroup.single()` runs with no process group at all, and a test
can build two models with different groups in one process.

torch.distributed does the communication: gloo on the CPU, NCCL on CUDA.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallelGroup:
    rank: int = 0
    world_size: int = 1
    # The process group; None when world_size is 1.
    group: dist.ProcessGroup | None = None

    @classmethod
    def single(cls) -> TensorParallelGroup:
        return cls()

    @property
    def is_first_rank(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns it."""
        if self.world_size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor | None:
        """Concatenate every rank's `x` along `dim` on rank 0; the other ranks get None.

        Gather, not all-gather: only rank 0 samples (vLLM's default for logits).
        """
        if self.world_size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(x, parts, dst=self._global_rank(0), group=self.group)
        return torch.cat(parts, dim=dim) if parts is not None else None

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank `src`'s `x` on every rank, in place."""
        if self.world_size > 1:
            dist.broadcast(x, src=self._global_rank(src), group=self.group)
        return x

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.group)

    def _global_rank(self, group_rank: int) -> int:
        if self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)


def init_tensor_parallel(
    rank: int,
    world_size: int,
    init_method: str,
    backend: str,
    timeout_s: float = 600.0,
) -> TensorParallelGroup:
    """Join the engine's process group (every worker is one TP rank)."""
    if world_size == 1:
        return TensorParallelGroup.single()
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        world_size=world_size,
        rank=rank,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return TensorParallelGroup(rank, world_size, dist.group.WORLD)


def destroy_tensor_parallel(tp: TensorParallelGroup) -> None:
    if tp.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
