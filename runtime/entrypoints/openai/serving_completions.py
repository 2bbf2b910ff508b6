"""POST /v1/completions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse
from pagoda.runtime.engine.core_client import EngineDeadError
from pagoda.runtime.engine.output_processor import OutputKind
from pagoda.runtime.entrypoints.openai.errors import APIError
from pagoda.runtime.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
    random_id,
)
from pagoda.runtime.entrypoints.openai.serving_engine import (
    SSE_DONE,
    OpenAIServing,
    ranked_logprobs,
    run_until_disconnected,
    sse,
    sse_error,
)
from pagoda.runtime.outputs import Logprob, RequestOutput
from pagoda.runtime.sampling_params import InvalidRequestError


def _prompts(prompt) -> list[str | list[int]]:
    """OpenAI's four prompt forms -> a list of prompts (text or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    if isinstance(prompt[0], int):
        return [list(prompt)]
    return list(prompt)


class CompletionLogprobsBuilder:
    """Accumulates OpenAI's legacy completions logprobs for one choice."""

    def __init__(self, top: int, text_offset: int = 0):
        self.top = top
        self.offset = text_offset

    def build(
        self, token_ids: list[int], positions: list[dict[int, Logprob]]
    ) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for tid, position in zip(token_ids, positions):
            sampled = position[tid]
            text = sampled.decoded_token or ""
            out.tokens.append(text)
            out.token_logprobs.append(sampled.logprob)
            out.text_offset.append(self.offset)
            self.offset += len(text)
            top = {
                (lp.decoded_token or ""): lp.logprob
                for _, lp in ranked_logprobs(position, max(self.top, 1))
            }
            top.setdefault(text, sampled.logprob)
            out.top_logprobs.append(top)
        return out


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, body: CompletionRequest, raw: Request):
        lora_request = self.check_model(body.model)
        model = self.response_model_name(lora_request)
        if body.suffix:
            raise APIError("suffix is not supported", 400, param="suffix")
        if body.echo and body.logprobs is not None:
            raise APIError(
                "echo together with logprobs needs prompt logprobs, which are not supported yet",
                400,
                param="echo",
            )
        defaults = self.engine.default_sampling_params
        max_tokens = body.max_tokens
        if max_tokens is None:  # OpenAI's default is 16, unless the model sets one
            max_tokens = defaults.get("max_tokens", 16)
        params = body.sampling_params(max_tokens, body.logprobs, defaults)
        prompts = _prompts(body.prompt)
        request_id = random_id("cmpl")
        created = int(time.time())
        # Streams get each step's new text (DELTA); a plain response needs
        # only the finished request (FINAL): one message instead of one per token.
        kind = OutputKind.DELTA if body.stream else OutputKind.FINAL
        handles = await self.add_requests(
            request_id,
            prompts,
            params,
            kind,
            body.add_special_tokens,
            body.cache_salt,
            lora_request,
        )
        try:
            tokenizer = self.engine.tokenizer
            echo_texts = [
                (p if isinstance(p, str) else tokenizer.decode(p)) if body.echo else ""
                for p in prompts
            ]
            if body.stream:
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                stream = self._stream(
                    handles,
                    request_id,
                    created,
                    params.n,
                    body.logprobs,
                    echo_texts,
                    include_usage,
                    model,
                )
                return self.stream_response(handles, stream)
            final = await run_until_disconnected(raw, self._collect(handles))
            return JSONResponse(
                self._response(
                    final, request_id, created, params.n, body.logprobs, echo_texts, model
                )
            )
        except BaseException:
            self.abort_unfinished(handles)
            raise

    async def _collect(self, handles) -> list[RequestOutput]:
        final: list[RequestOutput | None] = [None] * len(handles)
        async with self.output_streams(handles) as outputs:
            async for i, out in outputs:
                final[i] = out
        return final  # type: ignore[return-value]

    def _response(self, final, request_id, created, n, logprobs, echo_texts, model: str) -> dict:
        choices = []
        prompt_tokens = completion_tokens = cached_tokens = 0
        for i, ro in enumerate(final):
            prompt_tokens += len(ro.prompt_token_ids)
            cached_tokens += ro.num_cached_tokens
            for c in ro.outputs:
                completion_tokens += len(c.token_ids)
                lp = None
                if logprobs is not None and c.logprobs is not None:
                    lp = CompletionLogprobsBuilder(logprobs).build(c.token_ids, c.logprobs)
                choices.append(
                    CompletionChoice(
                        index=i * n + c.index,
                        text=echo_texts[i] + c.text,
                        logprobs=lp,
                        finish_reason=c.finish_reason,
                        stop_reason=c.stop_reason,
                    )
                )
        choices.sort(key=lambda c: c.index)
        usage = UsageInfo.of(prompt_tokens, completion_tokens, cached_tokens)
        resp = CompletionResponse(
            id=request_id, created=created, model=model, choices=choices, usage=usage
        )
        return resp.model_dump()

    async def _stream(
        self, handles, request_id, created, n, logprobs, echo_texts, include_usage, model: str
    ) -> AsyncIterator[str]:
        prompt_tokens = completion_tokens = 0
        cached = [0] * len(handles)
        first = [True] * len(handles)
        builders: dict[int, CompletionLogprobsBuilder] = {}
        started: set[int] = set()
        try:
            async with self.output_streams(handles) as outputs:
                async for i, ro in outputs:
                    if first[i]:
                        first[i] = False
                        prompt_tokens += len(ro.prompt_token_ids)
                    cached[i] = ro.num_cached_tokens
                    for c in ro.outputs:
                        completion_tokens += len(c.token_ids)
                        index = i * n + c.index
                        text = c.text
                        if index not in started:
                            started.add(index)
                            text = echo_texts[i] + text
                        lp = None
                        if logprobs is not None and c.logprobs is not None:
                            builder = builders.setdefault(
                                index, CompletionLogprobsBuilder(logprobs)
                            )
                            lp = builder.build(c.token_ids, c.logprobs)
                        chunk = CompletionChunk(
                            id=request_id,
                            created=created,
                            model=model,
                            choices=[
                                CompletionChoice(
                                    index=index,
                                    text=text,
                                    logprobs=lp,
                                    finish_reason=c.finish_reason,
                                    stop_reason=c.stop_reason,
                                )
                            ],
                        )
                        yield sse(chunk.model_dump())
                if include_usage:
                    usage = UsageInfo.of(prompt_tokens, completion_tokens, sum(cached))
                    chunk = CompletionChunk(
                        id=request_id,
                        created=created,
                        model=model,
                        choices=[],
                        usage=usage,
                    )
                    yield sse(chunk.model_dump())
        except EngineDeadError as exc:
            yield sse_error(f"the engine is not running: {exc}", 503)
        yield SSE_DONE
