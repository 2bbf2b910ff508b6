"""Turn user prompts into validated engine-core requests."""

from __future__ import annotations

import logging
from typing import Any

from pagoda.runtime.core.outputs import EngineCoreRequest
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.sampling_params import InvalidRequestError, SamplingParams

logger = logging.getLogger(__name__)

Prompt = str | list[int]


def log_generation_setup(eos_token_ids: tuple[int, ...], defaults: dict) -> None:
    """Say at start-up what ends a sequence and which sampling defaults the
    model's generation_config.json set: both change outputs silently otherwise."""
    logger.info("End-of-sequence token ids: %s", list(eos_token_ids) or "none")
    if defaults:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(defaults.items()))
        logger.info(
            "Default sampling parameters from the model's generation config "
            "(requests that set a field override it): %s",
            shown,
        )


def resolve_eos_token_ids(model_eos_ids: tuple[int, ...], tokenizer: Any | None) -> tuple[int, ...]:
    """Every id that ends a sequence, resolved once per model: the
    tokenizer's EOS, then config.json's and generation_config.json's lists.

    They disagree in real models: Llama 3.1 Instruct's tokenizer names
    `<|eot_id|>` while config.json lists `<|end_of_text|>`, `<|eom_id|>` and
    `<|eot_id|>`; Qwen2.5 Instruct's generation_config adds `<|endoftext|>`
    to the tokenizer's `<|im_end|>`. Stopping must honour all of them, and
    `min_tokens` must mask all of them.
    """
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if isinstance(eos, int):
        ids.append(eos)
    ids += model_eos_ids
    return tuple(dict.fromkeys(ids))


class InputProcessor:
    """Tokenizes and validates; every error names the offending field."""

    def __init__(
        self,
        tokenizer: Any | None,
        max_model_len: int,
        vocab_size: int,
        eos_token_ids: tuple[int, ...] = (),
    ):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids

    def tokenize(self, prompt: Prompt, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a text prompt (or the ids given).

        `add_special_tokens` adds what the tokenizer adds around a plain text
        (a BOS for Llama and Mistral). Chat prompts are rendered by a template
        that already wrote those tokens, so they are encoded without them
        (vLLM's default): encoding them with would start the prompt with two
        BOS tokens.
        """
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt must not be empty", param="prompt")
            if self.tokenizer is None:
                raise InvalidRequestError(
                    "this model has no tokenizer: pass prompts as token ids", param="prompt"
                )
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        if not isinstance(prompt, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            raise InvalidRequestError(
                "prompt must be a string or a list of token ids", param="prompt"
            )
        return list(prompt)

    def process(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
        prompt_token_ids: list[int] | None = None,
        add_special_tokens: bool = True,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> tuple[list[int], EngineCoreRequest]:
        """Return (prompt token ids, the request for the engine core).

        `prompt_token_ids`, when the caller already tokenized `prompt`, saves
        tokenizing it again. `cache_salt` isolates the request's prefix-cache
        entries from requests with another salt (one tenant's from another's).
        """
        token_ids = (
            self.tokenize(prompt, add_special_tokens)
            if prompt_token_ids is None
            else prompt_token_ids
        )
        self.validate_prompt(token_ids)
        self.validate_params(params)
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise InvalidRequestError("cache_salt must be a non-empty string", param="cache_salt")
        req = EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            eos_token_ids=self.eos_token_ids,
            priority=priority,
            cache_salt=cache_salt,
            lora_request=lora_request,
        )
        if arrival_time is not None:
            req.arrival_time = arrival_time
        return token_ids, req

    def validate_params(self, params: SamplingParams) -> None:
        """Field ranges, then what only the model knows: token ids in the vocabulary."""
        params.validate()
        if params.logit_bias:
            bad = next((t for t in params.logit_bias if t >= self.vocab_size), None)
            if bad is not None:
                raise InvalidRequestError(
                    f"logit_bias token id {bad} is outside the vocabulary [0, {self.vocab_size})",
                    param="logit_bias",
                )

    def validate_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        if len(token_ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens, "
                f"but the prompt has {len(token_ids)} tokens (at least one token must be "
                "left for the output)",
                param="prompt",
            )
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token id {bad} is outside the vocabulary [0, {self.vocab_size})", param="prompt"
            )
