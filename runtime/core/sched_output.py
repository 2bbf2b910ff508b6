"""The scheduler's decision for one step, and what the model runner returns.

`SchedulerOutput` carries only what changed since the last step, so the model
runner can keep a persistent batch (and, with tensor parallelism, one small
message is broadcast per step).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from pagoda.runtime.core.outputs import TokenLogprobs
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request the model runner has not seen, or sees again after preemption.

    For a resumed request `output_token_ids` holds what it generated before it
    was preempted; those tokens are recomputed as part of its "prompt" and
    still count for penalties.
    """

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...]
    block_ids: list[int]
    num_computed_tokens: int
    lora_request: LoRARequest | None = None


@dataclass
class CachedRequestData:
    """Requests already in the runner's batch, column-wise."""

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    # The whole decision: request id -> tokens to compute this step. Prefill
    # chunks and decodes are the same thing here.
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Requests the runner must drop from its batch: finished, aborted or
    # preempted since the last step.
    finished_req_ids: set[str] = field(default_factory=set)
    # Speculative decoding: request id -> the draft tokens to verify this
    # step, which are the last len(drafts) of its num_scheduled_tokens.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class ModelRunnerOutput:
    """Tokens sampled this step, per request that reached the end of its
    known tokens (requests in the middle of a chunked prefill sample none).

    With speculative decoding a request gets 1 to k+1 tokens (its accepted
    drafts, then the target's own token), and `spec_token_ids` holds the
    drafts proposed for its next step.
    """

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)


class AsyncModelRunnerOutput(ABC):
    """A step whose tokens are still on their way to the host (async
    scheduling): the runner launched it and returned; `get_output` waits."""

    @abstractmethod
    def get_output(self) -> ModelRunnerOutput:
        """The step's tokens, waiting for the device if they are not in yet."""
