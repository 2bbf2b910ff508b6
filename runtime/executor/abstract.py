"""The seam between the engine core and the workers (vLLM V1's Executor).

The engine core never touches a worker directly: it asks the executor to run
a method on every rank (`collective_rpc`) or to run one step
(`execute_model`, which returns the first rank's sampled tokens). With one
rank the worker lives in the engine core's process (`UniProcExecutor`); with
several, each rank is a process of its own (`MultiprocExecutor`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from pagoda.runtime.config import EngineConfig
from pagoda.runtime.core.sched_output import (
    AsyncModelRunnerOutput,
    ModelRunnerOutput,
    SchedulerOutput,
)
from pagoda.runtime.worker.worker import WorkerMemory


class WorkerDiedError(RuntimeError):
    """A worker process is gone: the engine cannot step any more."""


class Executor(ABC):
    def __init__(self, config: EngineConfig):
        self.config = config

    @staticmethod
    def create(config: EngineConfig) -> Executor:
        """The executor the parallel config calls for, workers started and models loaded."""
        if config.parallel_config.world_size == 1:
            from pagoda.runtime.executor.uniproc import UniProcExecutor

            return UniProcExecutor(config)
        from pagoda.runtime.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(config)

    @abstractmethod
    def collective_rpc(
        self, method: str, args: tuple = (), kwargs: dict | None = None
    ) -> list[Any]:
        """Call `Worker.<method>(*args, **kwargs)` on every rank; results in rank order."""

    @abstractmethod
    def execute_model(
        self, scheduler_output: SchedulerOutput
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        """Run one step on every rank; the first rank's output (with async
        scheduling, possibly still on its way: AsyncModelRunnerOutput)."""

    def determine_num_blocks(self) -> int:
        """KV blocks every rank can hold: the smallest rank's budget decides."""
        return min(self.collective_rpc("determine_num_blocks"))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_kv_cache", (num_blocks,))

    def memory_info(self) -> WorkerMemory:
        """The first rank's weights and bytes per KV block (every rank holds
        its own shard of both, so the ranks are alike)."""
        return self.collective_rpc("memory_info")[0]

    def check_health(self) -> None:  # noqa: B027 (a hook: one process has nothing to check)
        """Raise WorkerDiedError if a worker is gone."""

    def register_failure_callback(self, callback: Callable[[str], None]) -> None:  # noqa: B027
        """Have `callback(reason)` called, from any thread, when a worker dies
        (an idle engine core learns it this way). One process: never."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every worker; idempotent."""
