"""One request's pending output in the API process (vLLM's RequestOutputCollector).

The output handler puts every step's output here; the request's consumer (an
HTTP response) takes them when it can. A consumer slower than the engine, such
as an SSE client on a slow link, must not make the server hold one object per
step: an output put while another is still pending is merged into it (DELTA
outputs are concatenated, FINAL and CUMULATIVE ones replace it), so at most
one output per request is ever pending.
"""

from __future__ import annotations

import asyncio
import dataclasses

from pagoda.runtime.outputs import CompletionOutput, RequestOutput


class RequestOutputCollector:
    """At most one pending output (or the error that ended the request)."""

    def __init__(self, merge_deltas: bool):
        self.merge_deltas = merge_deltas
        self._pending: RequestOutput | BaseException | None = None
        self._ready = asyncio.Event()

    @property
    def has_pending(self) -> bool:
        return self._pending is not None

    def put(self, output: RequestOutput | BaseException) -> None:
        """Never blocks; merges with what the consumer has not taken yet."""
        pending = self._pending
        if pending is None or isinstance(output, BaseException):
            self._pending = output
        elif isinstance(pending, RequestOutput):
            self._pending = merge_outputs(pending, output) if self.merge_deltas else output
        # An error already pending stays: it ends the request anyway.
        self._ready.set()

    async def get(self) -> RequestOutput:
        """The next (merged) output; raises the error that ended the request."""
        while self._pending is None:
            await self._ready.wait()
        output, self._pending = self._pending, None
        self._ready.clear()
        if isinstance(output, BaseException):
            raise output
        return output


def merge_outputs(first: RequestOutput, later: RequestOutput) -> RequestOutput:
    """Two consecutive DELTA outputs of one request as one: per completion
    index, text, token ids and logprobs are concatenated; finish state, the
    cumulative logprob and the request-level fields are the later one's."""
    merged = {c.index: c for c in first.outputs}
    for c in later.outputs:
        prev = merged.get(c.index)
        if prev is None:
            merged[c.index] = c
            continue
        logprobs = prev.logprobs
        if c.logprobs is not None:
            logprobs = (prev.logprobs or []) + c.logprobs
        merged[c.index] = CompletionOutput(
            index=c.index,
            text=prev.text + c.text,
            token_ids=prev.token_ids + c.token_ids,
            cumulative_logprob=c.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
        )
    return dataclasses.replace(later, outputs=sorted(merged.values(), key=lambda c: c.index))
