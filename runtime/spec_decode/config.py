"""`speculative_config`: what `--speculative-config` and `LLM(speculative_config=...)` take.

The JSON follows vLLM's keys, so a command line written for vLLM works here:

    {"method": "ngram", "num_speculative_tokens": 3,
     "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    {"method": "draft_model", "model": "smollm2-135m-instruct",
     "num_speculative_tokens": 3, "hf_overrides": {"num_hidden_layers": 8}}

A draft model must share the target's tokenizer (its vocabulary size is
checked). `hf_overrides` with fewer `num_hidden_layers` loads a prefix of the
layers of the same checkpoint: the cheap draft the tests and the CPU demo use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagoda.runtime.sampling_params import InvalidRequestError

if TYPE_CHECKING:
    from pagoda.runtime.config import EngineArgs
    from pagoda.runtime.model_config import ModelConfig

METHODS = ("ngram", "draft_model")
# Keys accepted in the JSON; anything else is refused (a typo would otherwise
# silently run without speculation).
_KEYS = {
    "method",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "model",
    "hf_overrides",
    "min_acceptance_rate",
}
# Drafts verified per step are paid for in the step's token budget and, on a
# draft model, in one draft forward each: beyond this the tail is ~never hit.
MAX_SPECULATIVE_TOKENS = 16


@dataclass
class SpeculativeConfig:
    """Resolved speculative decoding settings, shipped to the core and the worker.

    `min_acceptance_rate`: when a request's recent drafts are accepted at a
    lower rate than this (accepted / drafted tokens), drafting pauses for it
    (with a growing back-off), so a workload the proposer cannot predict runs
    as fast as without speculation; 0 never pauses.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    model: str | None = None
    hf_overrides: dict = field(default_factory=dict)
    min_acceptance_rate: float = 0.2
    # The draft model, resolved like the target (method "draft_model" only).
    draft_model_config: ModelConfig | None = None

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots past the verified tokens a step needs: the draft model
        writes the KV of its own proposals there (n-gram needs none)."""
        return self.num_speculative_tokens if self.method == "draft_model" else 0

    def summary(self) -> str:
        if self.method == "ngram":
            extra = f"prompt_lookup {self.prompt_lookup_min}..{self.prompt_lookup_max}"
        else:
            layers = self.draft_model_config.arch.num_hidden_layers
            extra = f"draft {self.model} ({layers} layers)"
        return (
            f"method={self.method}, k={self.num_speculative_tokens}, {extra}, "
            f"pause below {self.min_acceptance_rate:.0%} acceptance"
        )


def resolve_speculative_config(
    spec: dict | None, args: EngineArgs, target: ModelConfig
) -> SpeculativeConfig | None:
    """Validate the user's dict (None or {} means off) and resolve the draft
    model; errors name the field as `speculative_config.<key>`."""
    if not spec:
        return None

    def fail(key: str, msg: str) -> InvalidRequestError:
        return InvalidRequestError(
            f"speculative_config.{key} {msg}", param=f"speculative_config.{key}"
        )

    unknown = set(spec) - _KEYS
    if unknown:
        raise fail(sorted(unknown)[0], f"is not a known key (known: {', '.join(sorted(_KEYS))})")
    method = spec.get("method")
    if method not in METHODS:
        raise fail("method", f"must be one of {METHODS}, got {method!r}")
    k = spec.get("num_speculative_tokens")
    if not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise fail("num_speculative_tokens", f"must be in [1, {MAX_SPECULATIVE_TOKENS}]")
    cfg = SpeculativeConfig(
        method=method,
        num_speculative_tokens=k,
        prompt_lookup_min=int(spec.get("prompt_lookup_min", 2)),
        prompt_lookup_max=int(spec.get("prompt_lookup_max", spec.get("prompt_lookup_min", 5))),
        model=spec.get("model"),
        hf_overrides=dict(spec.get("hf_overrides") or {}),
        min_acceptance_rate=float(spec.get("min_acceptance_rate", 0.2)),
    )
    if not 1 <= cfg.prompt_lookup_min <= cfg.prompt_lookup_max:
        raise fail("prompt_lookup_min", "must be at least 1 and at most prompt_lookup_max")
    if not 0.0 <= cfg.min_acceptance_rate <= 1.0:
        raise fail("min_acceptance_rate", "must be in [0, 1]")
    if args.tensor_parallel_size > 1:
        # Rank 0 samples for the group and the others learn one token per
        # request and step; a variable count would need its own broadcast.
        raise InvalidRequestError(
            "speculative decoding is not supported with tensor_parallel_size > 1 yet",
            param="speculative_config",
        )
    if method == "draft_model":
        if not cfg.model:
            raise fail("model", "is required for method 'draft_model'")
        cfg.draft_model_config = _resolve_draft(cfg, args, target)
    return cfg


def _resolve_draft(cfg: SpeculativeConfig, args: EngineArgs, target: ModelConfig) -> ModelConfig:
    import dataclasses

    from pagoda.runtime.model_loader.resolve import resolve_model_config

    draft_args = dataclasses.replace(
        args,
        model=cfg.model,
        tokenizer=None,
        hf_overrides=cfg.hf_overrides,
        max_model_len=None,
        random_weights=args.random_weights,
        speculative_config=None,
    )
    try:
        draft = resolve_model_config(draft_args)
    except InvalidRequestError as exc:
        raise InvalidRequestError(
            f"speculative_config.model: {exc}", param="speculative_config.model"
        ) from exc
    if draft.vocab_size != target.vocab_size:
        raise InvalidRequestError(
            f"speculative_config.model has a vocabulary of {draft.vocab_size} tokens, "
            f"the target {target.vocab_size}: a draft must share the target's tokenizer",
            param="speculative_config.model",
        )
    if draft.max_model_len < target.max_model_len:
        raise InvalidRequestError(
            f"speculative_config.model handles {draft.max_model_len} tokens, fewer than "
            f"max_model_len {target.max_model_len}",
            param="speculative_config.model",
        )
    # The draft runs beside the target on its device, in its dtype and length.
    return dataclasses.replace(
        draft, dtype=target.dtype, device=target.device, max_model_len=target.max_model_len
    )
