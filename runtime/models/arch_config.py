"""The shape of a Llama-family model, read from config.json or GGUF metadata."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pagoda.runtime.sampling_params import InvalidRequestError

# Architectures (config.json's "architectures") that the Llama implementation
# serves; they differ only in fields this config carries (QKV bias, RoPE, ties).
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


@dataclass
class ModelArchConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    # Every id config.json lists as end of sequence (Llama 3.1 Instruct lists
    # three); the front end adds generation_config's and the tokenizer's.
    eos_token_ids: tuple[int, ...] = ()
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise InvalidRequestError(
                "num_attention_heads must be a multiple of num_key_value_heads",
                param="num_key_value_heads",
            )

    @property
    def sliding_window(self) -> int | None:
        """The attention window of the layers that have one (Mistral v0.1,
        Qwen2 with use_sliding_window), or None when every layer attends to
        its whole context. Pagoda always attends to the whole context, which
        equals windowed attention only while the context fits the window."""
        window = self.extra.get("sliding_window")
        if not window:
            return None
        layer_types = self.extra.get("layer_types")
        if layer_types is not None:  # transformers >= 4.53 spells it out
            return window if "sliding_attention" in layer_types else None
        if self.architecture == "Qwen2ForCausalLM":
            # Qwen2 slides only from layer max_window_layers on, and only if asked.
            first = self.extra.get("max_window_layers", 0)
            if not self.extra.get("use_sliding_window") or first >= self.num_hidden_layers:
                return None
        return window

    @classmethod
    def from_hf_dict(cls, cfg: dict, overrides: dict | None = None) -> ModelArchConfig:
        """Build from a Hugging Face config.json dict; rejects unsupported
        architectures with an error naming the field."""
        cfg = {**cfg, **(overrides or {})}
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise InvalidRequestError(
                f"architectures {archs!r} is not supported; Pagoda serves "
                f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}",
                param="architectures",
            )
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        rope_scaling = cfg.get("rope_scaling")
        rope_theta = cfg.get("rope_theta")
        # transformers >= 5 may nest RoPE settings under "rope_parameters".
        params = cfg.get("rope_parameters")
        if isinstance(params, dict):
            rope_theta = rope_theta or params.get("rope_theta")
            if params.get("rope_type", "default") != "default":
                rope_scaling = params
        if isinstance(rope_scaling, dict) and rope_scaling.get(
            "rope_type", rope_scaling.get("type")
        ) in (None, "default"):
            rope_scaling = None
        known = {f.name for f in dataclasses.fields(cls)} | {"architectures"}
        return cls(
            architecture=arch,
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            vocab_size=cfg["vocab_size"],
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta or 10000.0,
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            # Qwen2 always has QKV bias; Llama-family configs say so explicitly.
            attention_bias=cfg.get("attention_bias", arch == "Qwen2ForCausalLM"),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=token_id_tuple(eos),
            extra={k: v for k, v in cfg.items() if k not in known},
        )


def token_id_tuple(value: int | list[int] | None) -> tuple[int, ...]:
    """config.json and generation_config.json give a token id as an int, a
    list of ints or null; always a tuple here, without duplicates."""
    if value is None:
        return ()
    ids = [value] if isinstance(value, int) else list(value)
    return tuple(dict.fromkeys(int(t) for t in ids))
