"""Command-line flags generated from `EngineArgs`, each with a `PAGODA_*`
environment-variable twin, so a container can be configured either way and
the flags never drift from the Python API's keyword arguments."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import typing

from pagoda.runtime.config import (
    ASYNC_SCHEDULING,
    ATTENTION_BACKENDS,
    DTYPES,
    KV_CACHE_DTYPES,
    PREFIX_CACHING_HASH_ALGOS,
    EngineArgs,
)

_CHOICES = {
    "dtype": DTYPES,
    "kv_cache_dtype": KV_CACHE_DTYPES,
    "attention_backend": ATTENTION_BACKENDS,
    "prefix_caching_hash_algo": PREFIX_CACHING_HASH_ALGOS,
    "async_scheduling": ASYNC_SCHEDULING,
}
_HELP = {
    "model": "built-in name, .gguf file, or Hugging Face folder (with --random-weights: a preset)",
    "revision": "branch, tag or commit of a Hugging Face repo id MODEL in the local cache",
    "dtype": "weights and activations dtype; auto = bfloat16 on CUDA and bf16-capable CPUs",
    "kv_cache_dtype": "KV cache dtype; auto = the model's. float16 or bfloat16 under a float32 "
    "model halves the cache's memory and what decode attention reads",
    "max_model_len": "longest prompt + output (default: the model's)",
    "max_num_seqs": "most requests in one step",
    "max_num_batched_tokens": "token budget of one step (prefill chunks + decodes); "
    "default 2048 on the CPU, 4096 on CUDA",
    "kv_cache_memory_gib": "CPU: GiB for the KV cache",
    "gpu_memory_utilization": "CUDA: fraction of device memory for weights + KV cache",
    "num_kv_blocks": "fix the number of KV blocks (overrides the memory budget)",
    "enable_prefix_caching": "reuse KV blocks of shared prompt prefixes",
    "prefix_caching_hash_algo": "prefix-cache block key: sha256 (collision-resistant) or builtin",
    "generation_config": "sampling defaults and EOS ids: auto (the model's "
    "generation_config.json), none, or a folder holding one",
    "random_weights": "random weights (benchmarks at sizes whose weights are absent)",
    "hf_overrides": "JSON object of model-config fields to override",
    "enforce_eager": "never replay decode graphs (CUDA graphs; on the CPU, recorded kernel calls)",
    "cuda_graph_sizes": "decode batch sizes to capture as graphs, comma-separated (the name is "
    "vLLM's; it sets the CPU's graphs too)",
    "tensor_parallel_size": "ranks (GPUs, or CPU processes) one model replica is split over",
    "enable_lora": "serve LoRA adapters (loaded at run time, chosen per request by name)",
    "max_loras": "LoRA adapters active in one batch",
    "max_lora_rank": "largest LoRA rank accepted (8, 16, 32, 64, 128 or 256)",
    "max_cpu_loras": "LoRA adapters kept loaded in host memory (default: 2 x max_loras)",
    "speculative_config": 'speculative decoding as JSON, e.g. {"method": "ngram", '
    '"num_speculative_tokens": 3} or {"method": "draft_model", "model": ..., '
    '"num_speculative_tokens": 3}',
    "async_scheduling": "schedule and launch step N+1 while step N runs, hiding the host's "
    "share of a step; auto = on for CUDA with one rank and no speculative decoding",
    "fused_kernels": "CUDA: Triton kernels for RMSNorm, SiLU-and-mul and RoPE; CPU: oneDNN "
    "linears on prepacked weights and the C++ decode attention kernel (off: torch twins, "
    "F.linear, torch attention)",
}
# Short, conventional spellings (vLLM's) beside the field names.
_ALIASES = {"kv_cache_memory_gib": ["--kv-cache-memory"]}


def env_name(field: str) -> str:
    return "PAGODA_" + field.upper()


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def _parse_int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from exc


def add_engine_args(parser: argparse.ArgumentParser, positional_model: bool = False) -> None:
    hints = typing.get_type_hints(EngineArgs)
    for f in dataclasses.fields(EngineArgs):
        kind = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        env = os.environ.get(env_name(f.name))
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{_HELP.get(f.name, '')} [env {env_name(f.name)}]".strip()
        if f.name == "model" and positional_model:
            parser.add_argument("model", nargs="?", default=env or default, help=help_text)
            parser.add_argument("--model", dest="model_flag", default=None, help=argparse.SUPPRESS)
            continue
        names = [flag, *_ALIASES.get(f.name, [])]
        if kind is bool:
            value = _parse_bool(env) if env is not None else default
            parser.add_argument(
                *names, action=argparse.BooleanOptionalAction, default=value, help=help_text
            )
            continue
        base = [t for t in typing.get_args(kind) if t is not type(None)] or [kind]
        if dict in (kind, *base):
            conv = json.loads
        elif typing.get_origin(base[0]) is list:
            conv = _parse_int_list
        else:
            conv = base[0]
        value = conv(env) if env is not None else default
        parser.add_argument(
            *names,
            dest=f.name,
            type=conv,
            default=value,
            choices=_CHOICES.get(f.name),
            help=help_text,
        )


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineArgs)}
    if getattr(ns, "model_flag", None):
        values["model"] = ns.model_flag
    return EngineArgs(**values)
