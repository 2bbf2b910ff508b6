"""What the completions and chat routes share: model checks, load shedding,
prompt validation before a response starts, client-disconnect handling,
merging several request streams, and Server-Sent Events."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pagoda.runtime.engine.async_llm import AsyncLLM, RequestHandle
from pagoda.runtime.engine.output_processor import OutputKind
from pagoda.runtime.entrypoints.openai.errors import APIError, error_body
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.outputs import Logprob, RequestOutput
from pagoda.runtime.sampling_params import SamplingParams

T = TypeVar("T")


@dataclass
class ServingConfig:
    served_model_name: str


class ClientDisconnected(Exception):
    """The HTTP client went away before the response was ready."""


class OpenAIServing:
    """Base of the route handlers."""

    def __init__(self, engine: AsyncLLM, config: ServingConfig):
        self.engine = engine
        self.config = config

    @property
    def model_name(self) -> str:
        return self.config.served_model_name

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The adapter `model` names (None: the base model); 404 if it names
        nothing this server serves."""
        if model is None or model == self.model_name:
            return None
        registry = self.engine.lora_registry
        lora = registry.get(model) if registry is not None else None
        if lora is not None:
            return lora
        raise APIError(f"The model `{model}` does not exist.", 404, param="model")

    def response_model_name(self, lora_request: LoRARequest | None) -> str:
        """What a response's `model` says: the adapter asked for, else the base."""
        return lora_request.lora_name if lora_request is not None else self.model_name

    async def add_requests(
        self,
        request_id: str,
        prompts: list,
        params: SamplingParams,
        kind: OutputKind,
        add_special_tokens: bool = True,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> list[RequestHandle]:
        """Submit one engine request per prompt, all or none. Every refusal
        (bad field, overload, dead engine) raises here, before a response
        starts; a refused batch leaves nothing behind."""
        ids = (
            [request_id]
            if len(prompts) == 1
            else [f"{request_id}-{i}" for i in range(len(prompts))]
        )
        return await self.engine.add_requests(
            ids,
            prompts,
            params,
            kind,
            add_special_tokens=add_special_tokens,
            cache_salt=cache_salt,
            lora_request=lora_request,
        )

    def abort_unfinished(self, handles: list[RequestHandle]) -> None:
        """Abort every request of `handles` not finished; never awaits, so it is
        safe in `finally` blocks of cancelled code."""
        for handle in handles:
            if not handle.finished:
                self.engine.abort_soon(handle.request_id)

    def stream_response(
        self, handles: list[RequestHandle], body: AsyncIterator[str]
    ) -> StreamingResponse:
        return EngineStreamingResponse(body, self, handles)

    @contextlib.asynccontextmanager
    async def output_streams(
        self, handles: list[RequestHandle]
    ) -> AsyncIterator[AsyncIterator[tuple[int, RequestOutput]]]:
        """The requests' outputs interleaved as (request index, output).

        On leaving (finished, failed, or cancelled by a disconnect) every
        request not finished is aborted, even one whose stream never started
        (closing an unstarted generator runs none of its code).
        """
        merged = merge_async_iterators(*(self.engine.outputs(h) for h in handles))
        try:
            yield merged
        finally:
            self.abort_unfinished(handles)
            await merged.aclose()


class EngineStreamingResponse(StreamingResponse):
    """An SSE response that owns its engine requests from the moment it is
    created: whatever ends it (the last chunk, a disconnect before or after
    the first chunk, cancellation, an error), the requests not finished are
    aborted and forgotten. Starlette may cancel a stream before its generator
    ever ran (a client gone before the first chunk), and an unstarted
    generator runs none of its own clean-up code."""

    def __init__(self, body: AsyncIterator[str], serving: OpenAIServing, handles):
        super().__init__(body, media_type="text/event-stream")
        self._serving = serving
        self._handles = handles

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._serving.abort_unfinished(self._handles)
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()


async def run_until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work` unless the client disconnects first; then cancel it (which
    aborts its requests in the engine) and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientDisconnected()


async def merge_async_iterators(
    *iterators: AsyncIterator[T],
) -> AsyncIterator[tuple[int, T]]:
    """Interleave several async iterators as items arrive: (source index, item).

    Leaving early closes every source, so each request still running is aborted.
    """
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield 0, item
        return
    pending = {asyncio.ensure_future(anext(it)): i for i, it in enumerate(iterators)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                try:
                    item = fut.result()
                except StopAsyncIteration:
                    continue
                yield i, item
                pending[asyncio.ensure_future(anext(iterators[i]))] = i
    finally:
        for fut in pending:
            fut.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for it in iterators:
            await it.aclose()


def sse(data: Any) -> str:
    """One Server-Sent Event, as OpenAI frames them."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def sse_error(message: str, status: int) -> str:
    return sse(error_body(message, status))


def ranked_logprobs(position: dict[int, Logprob], top: int) -> list[tuple[int, Logprob]]:
    """The `top` most likely tokens of one position, best first."""
    entries = sorted(position.items(), key=lambda kv: kv[1].rank or 0)
    return entries[:top]


def sampled_logprob(position: dict[int, Logprob], token_id: int) -> Logprob:
    return position[token_id]
