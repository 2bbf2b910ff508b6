"""Turn engine-core outputs (token ids) into user outputs (text).

One `RequestState` per generated sequence; a request with `n>1` is a parent
whose children run as separate engine-core requests (ids `"{i}_{parent}"`)
sharing the prompt's KV blocks through the prefix cache. Stop strings are
found here, after detokenization; the caller aborts those requests in the
engine core.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from pagoda.runtime.core.outputs import EngineCoreOutput, EngineCoreOutputs, TokenLogprobs
from pagoda.runtime.core.request import FinishReason
from pagoda.runtime.engine.detokenizer import IncrementalDetokenizer
from pagoda.runtime.outputs import CompletionOutput, Logprob, RequestOutput
from pagoda.runtime.sampling_params import SamplingParams


class OutputKind(enum.Enum):
    FINAL = "final"  # one output per request, when it finishes
    DELTA = "delta"  # every step: only what is new (streaming)
    CUMULATIVE = "cumulative"  # every step: everything so far


def child_request_id(parent_id: str, index: int) -> str:
    return parent_id if index == 0 else f"{index}_{parent_id}"


@dataclass
class RequestState:
    request_id: str
    index: int
    parent: ParentRequest
    detokenizer: IncrementalDetokenizer | None
    want_logprobs: bool
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sent_tokens: int = 0
    sent_logprobs: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class ParentRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    kind: OutputKind
    children: list[RequestState] = field(default_factory=list)
    num_cached_tokens: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def finished(self) -> bool:
        return all(c.finished for c in self.children)


@dataclass
class ProcessedOutputs:
    request_outputs: list[RequestOutput]
    # Engine-core request ids to abort: their text hit a stop string.
    reqs_to_abort: list[str]


class OutputProcessor:
    def __init__(self, tokenizer: Any | None):
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}
        self.parents: dict[str, ParentRequest] = {}

    def has_unfinished_requests(self) -> bool:
        return bool(self.parents)

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        kind: OutputKind = OutputKind.FINAL,
        arrival_time: float | None = None,
    ) -> list[tuple[str, SamplingParams]]:
        """Register a request; returns (engine-core id, params) per sample."""
        if request_id in self.parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        parent = ParentRequest(request_id, prompt, prompt_token_ids, kind)
        if arrival_time is not None:
            parent.arrival_time = arrival_time
        children = []
        for i in range(params.n):
            child_params = params.for_child(i) if params.n > 1 else params
            rid = child_request_id(request_id, i)
            detok = None
            if self.tokenizer is not None:
                detok = IncrementalDetokenizer.from_params(
                    self.tokenizer, prompt_token_ids, child_params
                )
            state = RequestState(rid, i, parent, detok, params.logprobs is not None)
            parent.children.append(state)
            self.states[rid] = state
            children.append((rid, child_params))
        self.parents[request_id] = parent
        return children

    def abort_request(self, request_id: str) -> list[str]:
        """Forget a request; returns the engine-core ids still running."""
        parent = self.parents.pop(request_id, None)
        if parent is None:
            return []
        running = []
        for child in parent.children:
            self.states.pop(child.request_id, None)
            if not child.finished:
                running.append(child.request_id)
        return running

    def process_outputs(self, outputs: EngineCoreOutputs) -> ProcessedOutputs:
        now = time.monotonic()
        touched: dict[str, ParentRequest] = {}
        to_abort: list[str] = []
        for out in outputs.outputs:
            state = self.states.get(out.request_id)
            if state is None or state.finished:
                continue  # aborted meanwhile, or a step already in flight
            if not out.new_token_ids and out.finish_reason is None:
                continue  # events only (queued, scheduled): nothing for the user yet
            if self._update(state, out):
                to_abort.append(state.request_id)
            parent = state.parent
            if out.new_token_ids and parent.first_token_time is None:
                parent.first_token_time = now
            if out.num_cached_tokens:
                parent.num_cached_tokens = max(parent.num_cached_tokens, out.num_cached_tokens)
            touched[parent.request_id] = parent

        results = []
        for parent in touched.values():
            if parent.finished:
                parent.finished_time = now
                for child in parent.children:
                    self.states.pop(child.request_id, None)
                del self.parents[parent.request_id]
            if parent.kind is OutputKind.FINAL and not parent.finished:
                continue
            results.append(self._make_output(parent))
        return ProcessedOutputs(results, to_abort)

    def _update(self, state: RequestState, out: EngineCoreOutput) -> bool:
        """Apply one engine output; True if a stop string ended the request."""
        state.token_ids.extend(out.new_token_ids)
        if state.want_logprobs and out.new_logprobs:
            for lp in out.new_logprobs:
                state.logprobs.append(self._decode_logprobs(lp))
                state.cumulative_logprob += lp.logprobs[0]
        finish = out.finish_reason
        stopped_by_string = False
        if state.detokenizer is not None:
            stop = state.detokenizer.update(out.new_token_ids, finished=finish is not None)
            if stop is not None and finish is None:
                stopped_by_string = True
            if stop is not None:
                finish, state.stop_reason = FinishReason.STOP, stop
        if finish is not None:
            state.finish_reason = FinishReason(finish).value
            if not stopped_by_string and state.stop_reason is None:
                state.stop_reason = out.stop_reason
        return stopped_by_string

    def _decode_logprobs(self, lp: TokenLogprobs) -> dict[int, Logprob]:
        entries: dict[int, Logprob] = {}
        for i, (tid, value) in enumerate(zip(lp.token_ids, lp.logprobs)):
            if tid in entries:
                continue  # the sampled token is also among the top-N
            rank = lp.sampled_rank if i == 0 else i
            text = self.tokenizer.decode([tid]) if self.tokenizer is not None else None
            entries[tid] = Logprob(value, rank, text)
        return entries

    def _make_output(self, parent: ParentRequest) -> RequestOutput:
        delta = parent.kind is OutputKind.DELTA
        completions = []
        for child in parent.children:
            if delta and child.sent_tokens == len(child.token_ids) and not child.finished:
                continue
            completions.append(self._completion(child, delta))
        return RequestOutput(
            request_id=parent.request_id,
            prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids,
            outputs=completions,
            finished=parent.finished,
            num_cached_tokens=parent.num_cached_tokens,
            metrics={
                "arrival_time": parent.arrival_time,
                "first_token_time": parent.first_token_time,
                "finished_time": parent.finished_time,
            },
        )

    @staticmethod
    def _completion(child: RequestState, delta: bool) -> CompletionOutput:
        detok = child.detokenizer
        text = detok.get_next_output_text(child.finished, delta) if detok else ""
        if delta:
            token_ids = child.token_ids[child.sent_tokens :]
            logprobs = child.logprobs[child.sent_logprobs :]
        else:
            token_ids, logprobs = list(child.token_ids), list(child.logprobs)
        child.sent_tokens, child.sent_logprobs = len(child.token_ids), len(child.logprobs)
        return CompletionOutput(
            index=child.index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=child.cumulative_logprob if child.want_logprobs else None,
            logprobs=logprobs if child.want_logprobs else None,
            finish_reason=child.finish_reason,
            stop_reason=child.stop_reason,
        )
