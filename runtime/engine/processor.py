"""Turn user prompts into validated engine-core requests."""

from __future__ import annotations

from typing import Any

from pagoda.runtime.core.outputs import EngineCoreRequest
from pagoda.runtime.sampling_params import InvalidRequestError, SamplingParams

Prompt = str | list[int]


class InputProcessor:
    """Tokenizes and validates; every error names the offending field."""

    def __init__(
        self, tokenizer: Any | None, max_model_len: int, vocab_size: int, eos_token_id: int | None
    ):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt must not be empty", param="prompt")
            if self.tokenizer is None:
                raise InvalidRequestError(
                    "this model has no tokenizer: pass prompts as token ids", param="prompt"
                )
            return self.tokenizer.encode(prompt, add_special_tokens=True)
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
    ) -> tuple[list[int], EngineCoreRequest]:
        """Return (prompt token ids, the request for the engine core).

        `prompt_token_ids`, when the caller already tokenized `prompt`, saves
        tokenizing it again."""
        token_ids = self.tokenize(prompt) if prompt_token_ids is None else prompt_token_ids
        self.validate_prompt(token_ids)
        params.validate()
        req = EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            eos_token_id=self.eos_token_id,
            priority=priority,
        )
        if arrival_time is not None:
            req.arrival_time = arrival_time
        return token_ids, req

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
