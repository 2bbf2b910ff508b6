"""Per-request sampling parameters, validated once when the request arrives."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

# Integer fields cross a process boundary as msgpack (at most 64 bits) and
# index tensors: bound them here so an absurd value is a 400, not a 500.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Token ids, counts and lengths: no vocabulary or context comes near 2^31.
MAX_TOKEN_ID = 2**31 - 1
MAX_COUNT = 2**31 - 1
# OpenAI's limits: n in [1, 128], logit_bias values in [-100, 100].
MAX_N = 128
MAX_LOGIT_BIAS = 100.0
# Alternatives returned per position (OpenAI's top_logprobs limit).
MAX_LOGPROBS = 20
# At most this many entries in a request's list fields (stop strings, stop ids,
# logit_bias): each costs work on the hot path, so an unbounded list is a DoS.
MAX_LIST_LEN = 1024


class InvalidRequestError(ValueError):
    """A request field is out of range. `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams:
    """How to sample one request's output; mirrors vLLM's `SamplingParams`.

    temperature 0 means greedy. `top_k` -1 (or 0 from clients that use 0 as
    "off", normalised here) disables top-k. Penalties follow OpenAI
    (presence/frequency, over generated tokens) and the CTRL paper
    (repetition, over prompt and generated tokens).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # token id -> value added to its logit before sampling (OpenAI's
    # logit_bias; -100 effectively bans a token, 100 all but forces it).
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.logit_bias = dict(self.logit_bias) if self.logit_bias else None
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first field that is out of range."""

        def check(ok: bool, param: str, msg: str) -> None:
            if not ok:
                raise InvalidRequestError(f"{param} {msg}", param=param)

        check(
            _is_int(self.n) and 1 <= self.n <= MAX_N,
            "n",
            f"must be in [1, {MAX_N}], got {self.n!r}",
        )
        check(
            _is_num(self.temperature) and self.temperature >= 0,
            "temperature",
            f"must be non-negative, got {self.temperature!r}",
        )
        check(
            _is_num(self.top_p) and 0 < self.top_p <= 1,
            "top_p",
            f"must be in (0, 1], got {self.top_p!r}",
        )
        check(
            _is_int(self.top_k) and (self.top_k == -1 or 1 <= self.top_k <= MAX_COUNT),
            "top_k",
            f"must be -1 (disabled) or at least 1, got {self.top_k!r}",
        )
        check(
            _is_num(self.min_p) and 0 <= self.min_p <= 1,
            "min_p",
            f"must be in [0, 1], got {self.min_p!r}",
        )
        check(
            _is_num(self.presence_penalty) and -2 <= self.presence_penalty <= 2,
            "presence_penalty",
            f"must be in [-2, 2], got {self.presence_penalty!r}",
        )
        check(
            _is_num(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2,
            "frequency_penalty",
            f"must be in [-2, 2], got {self.frequency_penalty!r}",
        )
        check(
            _is_num(self.repetition_penalty) and self.repetition_penalty > 0,
            "repetition_penalty",
            f"must be positive, got {self.repetition_penalty!r}",
        )
        check(
            self.max_tokens is None
            or (_is_int(self.max_tokens) and 1 <= self.max_tokens <= MAX_COUNT),
            "max_tokens",
            f"must be in [1, {MAX_COUNT}], got {self.max_tokens!r}",
        )
        check(
            _is_int(self.min_tokens) and 0 <= self.min_tokens <= MAX_COUNT,
            "min_tokens",
            f"must be in [0, {MAX_COUNT}], got {self.min_tokens!r}",
        )
        if self.max_tokens is not None:
            check(
                self.min_tokens <= self.max_tokens,
                "min_tokens",
                f"must not exceed max_tokens ({self.max_tokens}), got {self.min_tokens}",
            )
        check(
            self.seed is None or (_is_int(self.seed) and INT64_MIN <= self.seed <= INT64_MAX),
            "seed",
            f"must be a 64-bit signed integer, got {self.seed!r}",
        )
        check(
            self.logprobs is None
            or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
            "logprobs",
            f"must be in [0, {MAX_LOGPROBS}], got {self.logprobs!r}",
        )
        check(
            len(self.stop) <= MAX_LIST_LEN and all(isinstance(s, str) and s for s in self.stop),
            "stop",
            f"must be at most {MAX_LIST_LEN} non-empty strings",
        )
        check(
            len(self.stop_token_ids) <= MAX_LIST_LEN
            and all(_is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in self.stop_token_ids),
            "stop_token_ids",
            f"must be at most {MAX_LIST_LEN} token ids in [0, {MAX_TOKEN_ID}]",
        )
        bias = self.logit_bias or {}
        check(
            len(bias) <= MAX_LIST_LEN
            and all(_is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in bias)
            and all(_is_num(v) and -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS for v in bias.values()),
            "logit_bias",
            f"must map at most {MAX_LIST_LEN} token ids to values in "
            f"[{-MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
        )

    def for_child(self, index: int) -> SamplingParams:
        """Parameters of the index-th of `n` samples: one sample each, and
        distinct seeds so seeded `n>1` requests do not repeat one sample."""
        # Wrap within int64: seed INT64_MAX with n=2 must not overflow the
        # child's seed (it crosses the process boundary as a 64-bit integer).
        seed = None if self.seed is None else (self.seed + index - INT64_MIN) % 2**64 + INT64_MIN
        return replace(self, n=1, seed=seed)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: object) -> bool:
    """A finite real number: NaN and infinities would poison the logits."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
