"""Messages that cross the engine-core boundary.

Plain dataclasses, so the offline engine needs no serialisation library; the
server encodes the same classes with msgspec, which supports dataclasses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pagoda.runtime.core.events import EngineCoreEvent
from pagoda.runtime.core.request import FinishReason
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.sampling_params import SamplingParams


@dataclass
class EngineCoreRequest:
    """A new request from the front end: already tokenized and validated."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    # Every id that ends the sequence (resolved once per model by the front end).
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0
    cache_extra_keys: tuple = ()
    # Enters the first block's prefix-cache key only (vLLM's cache_salt): the
    # chain makes every later block differ too.
    cache_salt: str | None = None
    lora_request: LoRARequest | None = None


@dataclass
class TokenLogprobs:
    """Log-probabilities for one generated position.

    `token_ids[0]` is the sampled token, followed by the top-N alternatives in
    descending order; `logprobs` is aligned with it. `sampled_rank` is the
    sampled token's 1-based rank in the full distribution.
    """

    token_ids: list[int]
    logprobs: list[float]
    sampled_rank: int


@dataclass
class EngineCoreOutput:
    """What one request produced in one step, and what happened to it."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    events: list[EngineCoreEvent] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class SpecDecodingStats:
    """Speculative decoding counters, cumulative since start (vLLM's names):
    drafts verified (a request's run of draft tokens in one step), draft
    tokens verified, of those accepted, and accepted per draft position
    (index 0 is the first draft token of a step)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verified draft of `num_draft_tokens` whose first
        `num_accepted_tokens` were accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        per_pos = self.num_accepted_tokens_per_pos
        if len(per_pos) < num_draft_tokens:
            per_pos.extend([0] * (num_draft_tokens - len(per_pos)))
        for i in range(num_accepted_tokens):
            per_pos[i] += 1


@dataclass
class SchedulerStats:
    """Engine state after a step; counters are cumulative since start."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    # LoRA adapters (lora_int_id -> requests) running and waiting; empty
    # when LoRA is off.
    running_loras: dict[int, int] = field(default_factory=dict)
    waiting_loras: dict[int, int] = field(default_factory=dict)
    # None when speculative decoding is off.
    spec_decoding: SpecDecodingStats | None = None


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = field(default_factory=time.monotonic)
