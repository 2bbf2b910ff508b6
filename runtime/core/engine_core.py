"""EngineCore: the busy loop's body. schedule -> execute -> update.

It sees only token ids; tokenization, detokenization and stop strings live in
the front end (the API server process, or the offline `LLM` in-process).
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

from pagoda.runtime.config import EngineArgs
from pagoda.runtime.core.outputs import EngineCoreOutputs, EngineCoreRequest
from pagoda.runtime.core.request import Request
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.model_config import ModelConfig, resolve_model_config
from pagoda.runtime.sampling_params import InvalidRequestError
from pagoda.runtime.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@dataclass
class MemoryReport:
    """What start-up decided about memory, in the units users tune."""

    weight_bytes: int
    kv_cache_bytes: int
    num_blocks: int
    block_size: int
    max_model_len: int

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrent_full_requests(self) -> float:
        return self.kv_cache_tokens / self.max_model_len

    def summary(self) -> str:
        return (
            f"weights {self.weight_bytes / 2**30:.2f} GiB; KV cache "
            f"{self.kv_cache_bytes / 2**30:.2f} GiB = {self.num_blocks} blocks of "
            f"{self.block_size} = {self.kv_cache_tokens} tokens; "
            f"{self.max_concurrent_full_requests:.1f} requests of max_model_len "
            f"{self.max_model_len} fit at once"
        )


class EngineCore:
    def __init__(self, args: EngineArgs, model_config: ModelConfig | None = None):
        args.validate()
        self.args = args
        self.model_config = model_config or resolve_model_config(args)
        cache_config = args.cache_config()
        sched_config = args.scheduler_config(self.model_config.max_model_len)
        self.runner = ModelRunner(
            self.model_config,
            cache_config,
            sched_config,
            args.attention_backend,
            args.seed,
            enforce_eager=args.enforce_eager,
            cuda_graph_sizes=args.cuda_graph_sizes,
            fused_kernels=args.fused_kernels,
        )
        self.runner.load_model()
        num_blocks = self.runner.determine_num_blocks()
        self.memory = MemoryReport(
            weight_bytes=self.runner.weight_bytes,
            kv_cache_bytes=num_blocks * self.runner.kv_bytes_per_block(),
            num_blocks=num_blocks,
            block_size=cache_config.block_size,
            max_model_len=self.model_config.max_model_len,
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
        self.runner.init_kv_cache(num_blocks)
        self.scheduler = Scheduler(sched_config, cache_config, num_blocks)
        logger.info("Memory: %s", self.memory.summary())
        # Start-up objects (weights' metadata, the block pool's thousands of
        # blocks) live forever: move them out of the collector's reach so
        # full collections in the step loop stay short (as vLLM does).
        gc.collect()
        gc.freeze()

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
                cache_extra_keys=req.cache_extra_keys,
                cache_salt=req.cache_salt,
            )
        )

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model once, and turn its tokens into outputs."""
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs(scheduler_stats=self.scheduler.make_stats())
        sched_out = self.scheduler.schedule()
        runner_out = self.runner.execute_model(sched_out)
        return self.scheduler.update_from_output(sched_out, runner_out)
