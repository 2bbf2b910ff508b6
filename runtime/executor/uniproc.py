"""One rank, in the engine core's own process: no extra process, no IPC."""

from __future__ import annotations

from typing import Any

from pagoda.runtime.config import EngineConfig
from pagoda.runtime.core.sched_output import (
    AsyncModelRunnerOutput,
    ModelRunnerOutput,
    SchedulerOutput,
)
from pagoda.runtime.executor.abstract import Executor
from pagoda.runtime.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.worker = Worker(config)
        self.worker.init_device()
        self.worker.load_model()

    def collective_rpc(
        self, method: str, args: tuple = (), kwargs: dict | None = None
    ) -> list[Any]:
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def execute_model(
        self, scheduler_output: SchedulerOutput
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        return self.worker.execute_model(scheduler_output)

    def shutdown(self) -> None:
        self.worker.shutdown()
