"""A request as the engine core sees it: token ids, sampling parameters, state."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from pagoda.runtime.core.events import EngineCoreEvent
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.sampling_params import SamplingParams


class FinishReason(str, enum.Enum):
    """Why a request stopped; the values are OpenAI's `finish_reason` strings."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything after PREEMPTED is a finished state.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def finish_reason(status: RequestStatus) -> FinishReason | None:
        return _FINISH_REASONS.get(status)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
}


@dataclass(eq=False)
class Request:
    """One sequence being generated (a request with `n>1` is `n` of these).

    `all_token_ids` is prompt + output; `num_computed_tokens` counts the
    tokens whose KV is in the cache (or is being written this step: the
    scheduler advances it when it schedules, as vLLM V1 does).
    `block_hashes` holds the prefix-cache key of each full block of
    `all_token_ids`, extended by the KV cache manager as blocks fill.
    `cache_extra_keys` enters every block hash (e.g. a LoRA adapter name) so
    requests that would compute different KV never share blocks;
    `cache_salt` enters the first one only. `eos_token_ids` are the ids that
    end the request (unless `ignore_eos`).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_model_len: int
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0
    cache_extra_keys: tuple = ()
    cache_salt: str | None = None
    lora_request: LoRARequest | None = None

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prefix-cache hits at first scheduling; -1 = not yet
    block_hashes: list[bytes | int] = field(default_factory=list)
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    first_scheduled_time: float | None = None
    # Speculative decoding: draft tokens proposed after the last step, to be
    # verified by the next; never part of all_token_ids (only verified
    # tokens are).
    spec_token_ids: list[int] = field(default_factory=list)
    # Async scheduling: tokens sampled by steps still in flight, not yet in
    # all_token_ids; the scheduler already schedules the step that feeds them.
    num_output_placeholders: int = 0
    # Events since the last output, for the front end's metrics.
    events: list[EngineCoreEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)
        budget = self.max_model_len - len(self.prompt_token_ids)
        wanted = self.sampling_params.max_tokens
        # Generation ends at max_model_len whatever max_tokens asks.
        self.max_tokens = budget if wanted is None else min(wanted, budget)

    @property
    def lora_int_id(self) -> int:
        """The adapter's id, 0 for the base model."""
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finish_reason(self) -> FinishReason | None:
        return RequestStatus.finish_reason(self.status)
