"""The resolved model: where its weights are, its shape, dtype, device and
context length. Built once by `pagoda.runtime.model_loader.resolve` in the
front end and shipped to the engine core and its workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from pagoda.runtime.models.arch_config import ModelArchConfig


@dataclass(frozen=True)
class GenerationConfig:
    """What the model's generation_config.json contributes: extra EOS ids and
    defaults for the sampling fields a request leaves unset
    (`pagoda.runtime.model_loader.generation_config` reads it)."""

    eos_token_ids: tuple[int, ...] = ()
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)


@dataclass
class ModelConfig:
    model: str
    source: str  # "gguf" | "hf" | "random"
    path: Path | None  # the GGUF file or the HF folder; None for presets
    arch: ModelArchConfig
    dtype: torch.dtype
    device: torch.device
    max_model_len: int
    # How to load the tokenizer: (folder, gguf file name or None); None when
    # the model has none (random weights from a preset).
    tokenizer: tuple[str, str | None] | None
    generation: GenerationConfig = field(default_factory=GenerationConfig)

    @property
    def vocab_size(self) -> int:
        return self.arch.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """config.json's EOS ids, then generation_config.json's (the front
        end adds the tokenizer's: `processor.resolve_eos_token_ids`)."""
        return tuple(dict.fromkeys(self.arch.eos_token_ids + self.generation.eos_token_ids))
