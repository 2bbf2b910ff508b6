"""Engine configuration: one flat `EngineArgs` (what users set, as CLI flags or
`LLM(**kwargs)`) that resolves into the per-part configs the engine uses."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagoda.runtime.sampling_params import InvalidRequestError

if TYPE_CHECKING:
    import torch
    from pagoda.runtime.model_config import ModelConfig
    from pagoda.runtime.models.arch_config import ModelArchConfig
    from pagoda.runtime.spec_decode.config import SpeculativeConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
# The KV cache's dtype, by the same names; auto is the model's. A 16-bit
# cache under a float32 model (llama.cpp's default, f16) halves what decode
# attention reads and doubles the tokens a memory budget holds.
KV_CACHE_DTYPES = DTYPES
ATTENTION_BACKENDS = ("auto", "torch", "triton")
# Prefix-cache block keys: sha256 resists crafted collisions (vLLM's default
# since CVE-2025-25183); builtin (Python's hash) is faster and only for
# trusted traffic. Measured in benchmarks/bench_prefix_hash.py.
PREFIX_CACHING_HASH_ALGOS = ("sha256", "builtin")
# Schedule step N+1 while step N runs on the device (vLLM's async scheduling).
# auto: on where it can overlap anything, i.e. CUDA with one rank and no
# speculative decoding; on the CPU the host and the forward share the cores.
ASYNC_SCHEDULING = ("auto", "on", "off")


@dataclass
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    # CUDA: this fraction of the device's memory is the budget for weights,
    # activations and the KV cache together (vLLM's gpu_memory_utilization).
    gpu_memory_utilization: float = 0.9
    # CPU: the KV cache gets this many GiB (vLLM's VLLM_CPU_KVCACHE_SPACE).
    kv_cache_memory_gib: float = 2.0
    # Fixes the number of blocks, bypassing the memory budget (tests, tuning).
    num_kv_blocks: int | None = None
    prefix_caching_hash_algo: str = "sha256"
    # One of KV_CACHE_DTYPES; `kv_cache_dtype` resolves it.
    cache_dtype: str = "auto"

    def kv_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype the KV cache is allocated in: the model's under auto."""
        if self.cache_dtype == "auto":
            return model_dtype
        import torch

        return getattr(torch, self.cache_dtype)


# A step's token budget by device type when the user gives none.
DEFAULT_MAX_NUM_BATCHED_TOKENS = {"cuda": 4096, "cpu": 2048}


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096
    max_model_len: int = 8192
    # Distinct LoRA adapters one step may hold; 0 when LoRA is off.
    max_loras: int = 0
    # Step N+1 is scheduled and launched before step N's tokens reach the
    # host: each running request holds a placeholder for its unseen token.
    async_scheduling: bool = False


@dataclass
class LoRAConfig:
    """Multi-LoRA serving (vLLM's flags)."""

    # Adapters active in one batch (each takes a slot in every projection).
    max_loras: int = 4
    # Largest rank an adapter may have; slots are this wide.
    max_lora_rank: int = 16
    # Adapters kept loaded in host memory; least recently used beyond this
    # are dropped (and reloaded from their folder when needed again).
    max_cpu_loras: int = 8


@dataclass
class ParallelConfig:
    """How one model replica is split over processes (tensor parallelism)."""

    tensor_parallel_size: int = 1
    # torch.distributed backend: "nccl" on CUDA, "gloo" on the CPU.
    distributed_backend: str = "gloo"

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size


@dataclass
class RunnerConfig:
    """How each worker runs the model: kernels, graphs, the seed."""

    attention_backend: str = "auto"
    enforce_eager: bool = False
    cuda_graph_sizes: list[int] | None = None
    fused_kernels: bool = True
    seed: int = 0


@dataclass
class EngineConfig:
    """Everything the engine core and its workers need, resolved once in the
    front end (the model found, its length and dtype decided) and shipped to
    them as is: no process resolves it again."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    runner_config: RunnerConfig
    lora_config: LoRAConfig | None = None
    speculative_config: SpeculativeConfig | None = None


@dataclass
class EngineArgs:
    """Every engine option; the CLI flags are these fields with dashes."""

    model: str = "smollm2-135m-instruct"
    # The branch, tag or commit of a Hugging Face repo id `model`, looked up
    # in the local cache (refs/<revision>); None: main.
    revision: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    max_num_seqs: int = 256
    # Default: 4096 on CUDA; 2048 on the CPU, where a 4096-token step's
    # activations outgrow the last-level cache and offline throughput fell
    # 18% against 2048 (docs/benchmarks.md; vLLM's CPU server default too).
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    # auto: the model's dtype (see KV_CACHE_DTYPES).
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_gib: float = 2.0
    num_kv_blocks: int | None = None
    # Where sampling defaults and extra EOS ids come from: "auto" reads the
    # model folder's generation_config.json, "none" ignores it, anything else
    # is a folder holding one (vLLM's --generation-config).
    generation_config: str = "auto"
    attention_backend: str = "auto"
    # Multi-LoRA: adapters are loaded at run time (load_lora_adapter, or the
    # adapters file) and selected per request by name.
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16
    # Default: twice max_loras.
    max_cpu_loras: int | None = None
    # Ranks one model is split over (one worker process each); the model's
    # attention heads must divide by it.
    tensor_parallel_size: int = 1
    # Replay captured graphs for decode-only steps of these batch sizes
    # (runtime/worker/decode_graph.py): CUDA graphs, default 1, 2, 4, 8, then
    # multiples of 16 up to max_num_seqs; on the CPU the recorded C++ kernel
    # calls of a step, default 1, 2, 4, 8, 16. enforce_eager turns graphs off.
    enforce_eager: bool = False
    cuda_graph_sizes: list[int] | None = None
    # CUDA: RMSNorm, SiLU-and-mul and RoPE run as Triton kernels; CPU: linear
    # layers run on weights packed at load (layers/packed_linear.py). Off
    # forces the plain torch path (the twins in pagoda.kernels.reference,
    # F.linear), e.g. to bisect a problem.
    fused_kernels: bool = True
    random_weights: bool = False
    # Extra fields of a model config, e.g. {"num_hidden_layers": 2} to shrink a
    # model for a quick check; applied on top of config.json or GGUF metadata.
    hf_overrides: dict = field(default_factory=dict)
    # Speculative decoding, vLLM's JSON: {"method": "ngram" | "draft_model",
    # "num_speculative_tokens": k, ...} (pagoda.runtime.spec_decode.config);
    # empty or None: off.
    speculative_config: dict | None = None
    # See ASYNC_SCHEDULING.
    async_scheduling: str = "auto"

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_kwargs(cls, **kwargs) -> EngineArgs:
        unknown = set(kwargs) - cls.field_names()
        if unknown:
            raise TypeError(f"unknown engine option(s): {', '.join(sorted(unknown))}")
        return cls(**kwargs)

    def validate(self) -> None:
        def check(ok: bool, param: str, msg: str) -> None:
            if not ok:
                raise InvalidRequestError(f"{param} {msg}", param=param)

        check(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        check(
            self.kv_cache_dtype in KV_CACHE_DTYPES,
            "kv_cache_dtype",
            f"must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}",
        )
        check(
            self.attention_backend in ATTENTION_BACKENDS,
            "attention_backend",
            f"must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}",
        )
        check(
            self.async_scheduling in ASYNC_SCHEDULING,
            "async_scheduling",
            f"must be one of {ASYNC_SCHEDULING}, got {self.async_scheduling!r}",
        )
        check(
            self.prefix_caching_hash_algo in PREFIX_CACHING_HASH_ALGOS,
            "prefix_caching_hash_algo",
            f"must be one of {PREFIX_CACHING_HASH_ALGOS}, got {self.prefix_caching_hash_algo!r}",
        )
        check(
            1 <= self.tensor_parallel_size <= 64,
            "tensor_parallel_size",
            f"must be in [1, 64], got {self.tensor_parallel_size}",
        )
        check(1 <= self.max_loras <= 64, "max_loras", "must be in [1, 64]")
        check(
            self.max_lora_rank in (8, 16, 32, 64, 128, 256),
            "max_lora_rank",
            "must be one of 8, 16, 32, 64, 128, 256",
        )
        check(
            self.max_cpu_loras is None or self.max_cpu_loras >= self.max_loras,
            "max_cpu_loras",
            f"must be at least max_loras ({self.max_loras})",
        )
        check(self.max_num_seqs >= 1, "max_num_seqs", "must be at least 1")
        check(
            self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
            "max_num_batched_tokens",
            "must be at least 1",
        )
        check(self.block_size in (8, 16, 32, 64, 128), "block_size", "must be 8, 16, 32, 64 or 128")
        check(
            0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            "must be in (0, 1]",
        )
        check(self.kv_cache_memory_gib > 0, "kv_cache_memory_gib", "must be positive")
        check(
            self.num_kv_blocks is None or self.num_kv_blocks >= 1,
            "num_kv_blocks",
            "must be at least 1",
        )
        check(
            self.max_model_len is None or self.max_model_len >= 1,
            "max_model_len",
            "must be at least 1",
        )

    def cache_config(self) -> CacheConfig:
        return CacheConfig(
            block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_memory_gib=self.kv_cache_memory_gib,
            num_kv_blocks=self.num_kv_blocks,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo,
            cache_dtype=self.kv_cache_dtype,
        )

    def scheduler_config(
        self, max_model_len: int, device_type: str, async_scheduling: bool = False
    ) -> SchedulerConfig:
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = DEFAULT_MAX_NUM_BATCHED_TOKENS.get(device_type, 4096)
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            max_loras=self.max_loras if self.enable_lora else 0,
            async_scheduling=async_scheduling,
        )

    def lora_config(self) -> LoRAConfig | None:
        if not self.enable_lora:
            return None
        return LoRAConfig(
            max_loras=self.max_loras,
            max_lora_rank=self.max_lora_rank,
            max_cpu_loras=self.max_cpu_loras or 2 * self.max_loras,
        )

    def create_engine_config(self) -> EngineConfig:
        """Validate, find the model (metadata only) and build the one config
        the engine runs with; errors name the offending field."""
        from pagoda.runtime.model_loader.resolve import resolve_model_config
        from pagoda.runtime.spec_decode.config import resolve_speculative_config

        self.validate()
        model_config = resolve_model_config(self)
        parallel = ParallelConfig(
            tensor_parallel_size=self.tensor_parallel_size,
            distributed_backend="nccl" if model_config.device.type == "cuda" else "gloo",
        )
        check_tensor_parallel(model_config.arch, parallel.tensor_parallel_size)
        speculative = resolve_speculative_config(self.speculative_config, self, model_config)
        overlap = resolve_async_scheduling(
            self.async_scheduling,
            model_config.device.type,
            parallel.tensor_parallel_size,
            speculative is not None,
        )
        return EngineConfig(
            model_config=model_config,
            cache_config=self.cache_config(),
            scheduler_config=self.scheduler_config(
                model_config.max_model_len, model_config.device.type, overlap
            ),
            parallel_config=parallel,
            runner_config=RunnerConfig(
                attention_backend=self.attention_backend,
                enforce_eager=self.enforce_eager,
                cuda_graph_sizes=self.cuda_graph_sizes,
                fused_kernels=self.fused_kernels,
                seed=self.seed,
            ),
            lora_config=self.lora_config(),
            speculative_config=speculative,
        )


def resolve_async_scheduling(
    mode: str, device_type: str, tensor_parallel_size: int, speculative: bool
) -> bool:
    """Whether steps overlap (see ASYNC_SCHEDULING). "on" is refused where the
    engine cannot do it: several ranks (rank 0's sampled tokens would have to
    reach the others before their next step) and speculative decoding (the
    next step's drafts depend on how many of this step's were accepted)."""
    if mode == "off":
        return False
    blockers = []
    if tensor_parallel_size > 1:
        blockers.append(f"tensor_parallel_size {tensor_parallel_size}")
    if speculative:
        blockers.append("speculative decoding")
    if mode == "auto":
        return device_type == "cuda" and not blockers
    if blockers:
        raise InvalidRequestError(
            f"async_scheduling cannot be on with {' and '.join(blockers)}",
            param="async_scheduling",
        )
    return True


def check_tensor_parallel(arch: ModelArchConfig, tp_size: int) -> None:
    """Refuse a split the model's shape does not allow, naming both numbers.

    Query heads and the MLP must divide evenly; KV heads either divide by the
    ranks or the ranks by them (then each KV head is replicated on
    tp_size / num_kv_heads ranks, as vLLM does).
    """
    if tp_size == 1:
        return
    problems = []
    if arch.num_attention_heads % tp_size:
        problems.append(f"{arch.num_attention_heads} attention heads")
    kv = arch.num_key_value_heads
    if kv % tp_size and tp_size % kv:
        problems.append(f"{kv} key/value heads")
    if arch.intermediate_size % tp_size:
        problems.append(f"an MLP of {arch.intermediate_size}")
    if problems:
        raise InvalidRequestError(
            f"tensor_parallel_size {tp_size} does not divide this model's "
            f"{' and '.join(problems)}; choose a size that divides them",
            param="tensor_parallel_size",
        )
