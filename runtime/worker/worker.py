"""A Worker: one tensor-parallel rank's device, process group, memory budget
and KV cache, around its ModelRunner (vLLM V1's split)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.core.sched_output import (
    AsyncModelRunnerOutput,
    ModelRunnerOutput,
    SchedulerOutput,
)
from pagoda.runtime.distributed.parallel_state import (
    TensorParallelGroup,
    destroy_tensor_parallel,
    init_tensor_parallel,
)
from pagoda.runtime.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerMemory:
    """One rank's weights and the bytes one KV block takes on it."""

    weight_bytes: int
    kv_bytes_per_block: int


class AllocatorRetryWatch:
    """Warns when the CUDA caching allocator had to free its cached blocks
    and retry an allocation (`num_alloc_retries` grew). Each retry frees
    memory with cudaFree, which waits for the device: a step that hits it
    stalls the overlap of host and device. It means the KV cache, sized to
    `gpu_memory_utilization`, leaves too little room for a step's
    activations as the allocator has fragmented them.

    The stats are read at most every `interval_s` (the read builds a dict
    of every counter), so the per-step cost is one clock read."""

    def __init__(
        self,
        read_retries: Callable[[], int],
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.read_retries = read_retries
        self.interval_s = interval_s
        self.clock = clock
        self.seen = read_retries()
        self.next_check = clock() + interval_s

    def check(self) -> int:
        """The retries since the last check (0 between checks); warns when
        there were any."""
        now = self.clock()
        if now < self.next_check:
            return 0
        self.next_check = now + self.interval_s
        retries = self.read_retries()
        new, self.seen = retries - self.seen, retries
        if new > 0:
            logger.warning(
                "the CUDA caching allocator freed its cache and retried %d allocation(s) "
                "(%d in all): each synchronises the device. Lower --gpu-memory-utilization "
                "or --max-num-batched-tokens to leave the steps more room.",
                new,
                retries,
            )
        return new


class Worker:
    """Owns one rank. The executor calls, in order: `init_device`,
    `load_model`, `determine_num_blocks`, `initialize_kv_cache`, then
    `execute_model` every step, and `shutdown`."""

    def __init__(self, config: EngineConfig, rank: int = 0, distributed_init_method: str = ""):
        self.config = config
        self.rank = rank
        self.distributed_init_method = distributed_init_method
        self.device = config.model_config.device
        self.tp = TensorParallelGroup.single()
        self.runner: ModelRunner | None = None
        self.allocator_watch: AllocatorRetryWatch | None = None

    def init_device(self) -> None:
        parallel = self.config.parallel_config
        if self.device.type == "cuda":
            # One GPU per rank; CUDA_VISIBLE_DEVICES decides which ones.
            self.device = torch.device("cuda", self.rank % max(1, torch.cuda.device_count()))
            torch.cuda.set_device(self.device)
        elif parallel.world_size > 1:
            # Ranks share the machine's cores: threads beyond a fair share
            # only make the ranks preempt each other at every all-reduce.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // parallel.world_size))
        self.tp = init_tensor_parallel(
            self.rank,
            parallel.world_size,
            self.distributed_init_method,
            parallel.distributed_backend,
        )
        self.runner = ModelRunner(self.config, self.device, self.tp)

    def load_model(self) -> None:
        self.runner.load_model()

    def memory_info(self) -> WorkerMemory:
        return WorkerMemory(self.runner.weight_bytes, self.runner.kv_bytes_per_block())

    def determine_num_blocks(self) -> int:
        """Blocks that fit this rank's budget: on CUDA what is left of
        `gpu_memory_utilization` of the device after the weights and a
        profiling forward at the full token budget; on the CPU
        `kv_cache_memory_gib` (each rank's, as vLLM's CPU KV space)."""
        cache = self.config.cache_config
        if cache.num_kv_blocks is not None:
            return cache.num_kv_blocks
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.runner.profile_run()
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            torch.cuda.empty_cache()
            used_by_others = total - free - torch.cuda.memory_reserved(self.device)
            budget = total * cache.gpu_memory_utilization - peak - used_by_others
        else:
            budget = cache.kv_cache_memory_gib * 2**30
        return max(0, int(budget // self.runner.kv_bytes_per_block()))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.runner.initialize_kv_cache(num_blocks)
        if self.device.type == "cuda":
            device = self.device
            self.allocator_watch = AllocatorRetryWatch(
                lambda: torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
            )

    def execute_model(
        self, scheduler_output: SchedulerOutput
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None:
        if self.allocator_watch is not None:
            self.allocator_watch.check()
        return self.runner.execute_model(scheduler_output)

    def add_lora(self, lora_request) -> None:
        self.runner.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.runner.remove_lora(lora_int_id)

    def record_sampled_tokens(self, sampled_token_ids: dict[str, list[int]]) -> None:
        self.runner.record_sampled_tokens(sampled_token_ids)

    def shutdown(self) -> None:
        destroy_tensor_parallel(self.tp)
