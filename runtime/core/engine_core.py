"""EngineCore: the busy loop's body. schedule -> execute -> update.

With async scheduling one step stays in flight: each `step()` schedules and
launches step N+1, then turns step N's tokens into outputs, so the host's
scheduling, bookkeeping and input preparation run while the device computes.

It sees only token ids; tokenization, detokenization and stop strings live in
the front end (the API server process, or the offline `LLM` in-process).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pagoda.runtime.config import EngineConfig
from pagoda.runtime.core.outputs import EngineCoreOutputs, EngineCoreRequest
from pagoda.runtime.core.request import Request
from pagoda.runtime.core.sched_output import (
    AsyncModelRunnerOutput,
    ModelRunnerOutput,
    SchedulerOutput,
)
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.executor.abstract import Executor
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.sampling_params import InvalidRequestError

logger = logging.getLogger(__name__)

# A launched step: its decision and the runner's (possibly pending) output.
InFlight = tuple[SchedulerOutput, AsyncModelRunnerOutput | ModelRunnerOutput]


@dataclass
class MemoryReport:
    """What start-up decided about memory, in the units users tune."""

    weight_bytes: int
    kv_cache_bytes: int
    num_blocks: int
    block_size: int
    max_model_len: int
    kv_cache_dtype: str
    tensor_parallel_size: int = 1

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrent_full_requests(self) -> float:
        return self.kv_cache_tokens / self.max_model_len

    def summary(self) -> str:
        per_rank = " per rank" if self.tensor_parallel_size > 1 else ""
        return (
            f"weights {self.weight_bytes / 2**30:.2f} GiB{per_rank}; KV cache{per_rank} "
            f"({self.kv_cache_dtype}) "
            f"{self.kv_cache_bytes / 2**30:.2f} GiB = {self.num_blocks} blocks of "
            f"{self.block_size} = {self.kv_cache_tokens} tokens; "
            f"{self.max_concurrent_full_requests:.1f} requests of max_model_len "
            f"{self.max_model_len} fit at once"
        )


class EngineCore:
    """Scheduler + executor: one step is schedule -> execute -> update."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_config = config.model_config
        self.executor = Executor.create(config)
        self.async_scheduling = config.scheduler_config.async_scheduling
        # Async scheduling: the step launched last and not yet turned into outputs.
        self._in_flight: InFlight | None = None
        try:
            self._init_kv_cache(config)
        except BaseException:
            self.executor.shutdown()
            raise
        logger.info("Memory: %s", self.memory.summary())
        if config.speculative_config is not None:
            logger.info("Speculative decoding: %s", config.speculative_config.summary())

    def _init_kv_cache(self, config: EngineConfig) -> None:
        num_blocks = self.executor.determine_num_blocks()
        mem = self.executor.memory_info()
        self.memory = MemoryReport(
            weight_bytes=mem.weight_bytes,
            kv_cache_bytes=num_blocks * mem.kv_bytes_per_block,
            num_blocks=num_blocks,
            block_size=config.cache_config.block_size,
            max_model_len=self.model_config.max_model_len,
            tensor_parallel_size=config.parallel_config.world_size,
            kv_cache_dtype=str(
                config.cache_config.kv_cache_dtype(self.model_config.dtype)
            ).removeprefix("torch."),
        )
        if self.memory.kv_cache_tokens < self.model_config.max_model_len:
            flag = (
                "--gpu-memory-utilization"
                if self.model_config.device.type == "cuda"
                else "--kv-cache-memory"
            )
            raise InvalidRequestError(
                f"the KV cache holds {self.memory.kv_cache_tokens} tokens, fewer than one "
                f"request of max_model_len {self.model_config.max_model_len}: raise {flag} "
                "or lower --max-model-len",
                param="max_model_len",
            )
        self.executor.initialize_kv_cache(num_blocks)
        self.scheduler = Scheduler(
            config.scheduler_config, config.cache_config, num_blocks, config.speculative_config
        )

    def add_request(self, req: EngineCoreRequest) -> None:
        self.scheduler.add_request(
            Request(
                request_id=req.request_id,
                prompt_token_ids=req.prompt_token_ids,
                sampling_params=req.sampling_params,
                eos_token_ids=tuple(req.eos_token_ids),
                max_model_len=self.model_config.max_model_len,
                arrival_time=req.arrival_time,
                priority=req.priority,
                # The adapter changes every layer's KV: its id keys every block,
                # so the same prompt under two adapters never shares blocks.
                cache_extra_keys=req.cache_extra_keys
                + ((("lora", req.lora_request.lora_int_id),) if req.lora_request else ()),
                cache_salt=req.cache_salt,
                lora_request=req.lora_request,
            )
        )

    def add_lora(self, lora_request: LoRARequest) -> None:
        """Load an adapter on every worker (raises AdapterError, changing nothing)."""
        self.executor.collective_rpc("add_lora", (lora_request,))

    def remove_lora(self, lora_int_id: int) -> None:
        self.executor.collective_rpc("remove_lora", (lora_int_id,))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None

    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model once, and turn its tokens into outputs
        (with async scheduling: the previous step's tokens)."""
        if self.async_scheduling:
            return self._step_overlapped()
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs(scheduler_stats=self.scheduler.make_stats())
        sched_out = self.scheduler.schedule()
        runner_out = self.executor.execute_model(sched_out)
        return self.scheduler.update_from_output(sched_out, runner_out)

    def _step_overlapped(self) -> EngineCoreOutputs:
        scheduler = self.scheduler
        previous, self._in_flight = self._in_flight, None
        if scheduler.has_unfinished_requests():
            # Launched before the previous step's tokens are read: the device
            # goes from one step to the next without waiting for the host.
            sched_out = scheduler.schedule()
            self._in_flight = (sched_out, self.executor.execute_model(sched_out))
        if previous is None:
            return EngineCoreOutputs(scheduler_stats=scheduler.make_stats())
        sched_out, runner_out = previous
        if isinstance(runner_out, AsyncModelRunnerOutput):
            runner_out = runner_out.get_output()
        return scheduler.update_from_output(sched_out, runner_out)

    def shutdown(self) -> None:
        """Stop the workers (their processes, with tensor parallelism)."""
        self.executor.shutdown()
