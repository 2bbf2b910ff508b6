"""Resolve what the user asked for (a built-in name, a GGUF file, a Hugging
Face folder, a cached repo id, or a preset with random weights) into one
`ModelConfig`: metadata only, no weights are read."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.model_config import GenerationConfig, ModelConfig
from pagoda.runtime.model_loader.builtin import resolve_builtin
from pagoda.runtime.model_loader.generation_config import read_generation_config
from pagoda.runtime.model_loader.gguf_loader import read_gguf_config
from pagoda.runtime.model_loader.hf_loader import read_hf_config
from pagoda.runtime.model_loader.random_loader import PRESETS
from pagoda.runtime.models.arch_config import ModelArchConfig
from pagoda.runtime.sampling_params import InvalidRequestError

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_has_fast_bf16() -> bool:
    """True on CPUs with native bf16 matmul (AVX512-BF16 or AMX), where oneDNN
    runs bf16 several times faster than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return _DTYPES[dtype]
    if device.type == "cuda" or cpu_has_fast_bf16():
        return torch.bfloat16
    return torch.float32


def hf_cache_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The local snapshot of a Hugging Face repo id ("org/name") at `revision`
    (default main) in the cache ($HF_HOME), or None. Never downloads: pods
    read a mounted cache (`pagoda download` fills it)."""
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
        return None
    # Read the environment now: huggingface_hub fixes its defaults at import.
    cache_dir = os.environ.get("HF_HUB_CACHE")
    if cache_dir is None and "HF_HOME" in os.environ:
        cache_dir = os.path.join(os.environ["HF_HOME"], "hub")
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                repo_id=repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True
            )
        )
    except Exception:  # not cached, or not a valid repo id
        return None


def resolve_model_config(args: EngineArgs) -> ModelConfig:
    """Find the model's weights and shape; errors name the `model` field."""
    name = args.model
    builtin = resolve_builtin(name)
    path = builtin if builtin is not None else Path(name).expanduser()
    if builtin is None and not path.exists():
        path = hf_cache_snapshot(name, args.revision) or path
    overrides = args.hf_overrides
    if args.random_weights and name.lower() in PRESETS:
        source, path = "random", None
        arch = ModelArchConfig.from_hf_dict(PRESETS[name.lower()], overrides)
    elif path.is_file() and path.suffix == ".gguf":
        source, arch = "gguf", read_gguf_config(path, overrides)
    elif path.is_dir() and (path / "config.json").exists():
        source, arch = ("random" if args.random_weights else "hf"), read_hf_config(path, overrides)
    elif path.is_file() and path.name == "config.json" and args.random_weights:
        source, path = "random", path.parent
        with open(path / "config.json") as f:
            arch = ModelArchConfig.from_hf_dict(json.load(f), overrides)
    else:
        hint = (
            f"; with random_weights, a preset: {', '.join(PRESETS)}" if args.random_weights else ""
        )
        raise InvalidRequestError(
            f"model {name!r} not found: expected a built-in name (smollm2-135m-instruct), "
            f"a .gguf file, a folder with config.json, or a Hugging Face repo id already "
            f"in the local cache (HF_HOME){hint}",
            param="model",
        )

    device = resolve_device(args.device)
    max_len, limit = arch.max_position_embeddings, "max_position_embeddings"
    # Attention here is never windowed, so a sliding-window model is served
    # only up to its window, where both agree (vLLM's disable_sliding_window).
    window = arch.sliding_window
    if window is not None and window < max_len:
        max_len, limit = window, "sliding_window"
    if args.max_model_len is not None:
        if args.max_model_len > max_len:
            raise InvalidRequestError(
                f"max_model_len {args.max_model_len} exceeds the model's {limit} ({max_len})",
                param="max_model_len",
            )
        max_len = args.max_model_len
    return ModelConfig(
        generation=_generation_config(args.generation_config, source, path),
        model=name,
        source=source,
        path=path,
        arch=arch,
        dtype=resolve_dtype(args.dtype, device),
        device=device,
        max_model_len=max_len,
        tokenizer=_tokenizer_source(args, source, path),
    )


def _generation_config(setting: str, source: str, path: Path | None) -> GenerationConfig:
    if setting == "none":
        return GenerationConfig()
    if setting == "auto":
        folder = path if source in ("hf", "random") and path is not None and path.is_dir() else None
        return read_generation_config(folder)
    folder = Path(setting).expanduser()
    if not folder.is_dir():
        raise InvalidRequestError(
            f"generation_config {setting!r} is not 'auto', 'none' or a folder",
            param="generation_config",
        )
    return read_generation_config(folder)


def _tokenizer_source(args: EngineArgs, source: str, path: Path | None):
    if args.tokenizer:
        t = Path(args.tokenizer)
        return (str(t.parent), t.name) if t.suffix == ".gguf" else (str(t), None)
    if source == "gguf":
        return str(path.parent), path.name
    if path is not None and any(
        (path / f).exists() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    ):
        return str(path), None
    return None
