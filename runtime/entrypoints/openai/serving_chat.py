"""POST /v1/chat/completions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse
from pagoda.runtime.engine.core_client import EngineDeadError
from pagoda.runtime.engine.output_processor import OutputKind
from pagoda.runtime.entrypoints.openai.errors import APIError
from pagoda.runtime.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    ChatResponseMessage,
    ChatStreamChoice,
    ChatTokenLogprob,
    DeltaMessage,
    TopLogprob,
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


def chat_logprobs(
    token_ids: list[int], positions: list[dict[int, Logprob]], top: int
) -> ChatLogprobs:
    """OpenAI's chat `logprobs.content` for these generated tokens."""
    content = []
    for tid, position in zip(token_ids, positions):
        sampled = position[tid]
        token = sampled.decoded_token or ""
        content.append(
            ChatTokenLogprob(
                token=token,
                logprob=sampled.logprob,
                bytes=list(token.encode()),
                top_logprobs=[
                    TopLogprob(
                        token=lp.decoded_token or "",
                        logprob=lp.logprob,
                        bytes=list((lp.decoded_token or "").encode()),
                    )
                    for _, lp in ranked_logprobs(position, top)
                ],
            )
        )
    return ChatLogprobs(content=content)


class OpenAIServingChat(OpenAIServing):
    async def render_prompt(
        self, messages: list[ChatMessage], add_generation_prompt: bool, kwargs: dict | None
    ) -> str:
        """The model's chat template over the messages (in a thread: Jinja is slow)."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise APIError("this model has no chat template", 400, param="messages")
        conversation = [{"role": m.role, "content": m.text()} for m in messages]
        try:
            return await asyncio.to_thread(
                tokenizer.apply_chat_template,
                conversation,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **(kwargs or {}),
            )
        except Exception as exc:  # template errors are the caller's input
            raise APIError(f"chat template failed: {exc}", 400, param="messages") from exc

    async def create_chat_completion(self, body: ChatCompletionRequest, raw: Request):
        lora_request = self.check_model(body.model)
        model = self.response_model_name(lora_request)
        # (Unsupported fields such as a JSON response_format were refused when
        # the body was parsed: request_screen.py.)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError("top_logprobs requires logprobs to be true", 400, param="top_logprobs")
        max_tokens = body.max_completion_tokens
        if max_tokens is None:
            max_tokens = body.max_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        params = body.sampling_params(max_tokens, logprobs, self.engine.default_sampling_params)
        prompt = await self.render_prompt(
            body.messages, body.add_generation_prompt, body.chat_template_kwargs
        )
        self.engine.check_prompt_length(prompt, param="messages")
        request_id = random_id("chatcmpl")
        created = int(time.time())
        kind = OutputKind.DELTA if body.stream else OutputKind.FINAL
        handles = await self.add_requests(
            request_id,
            [prompt],
            params,
            kind,
            body.add_special_tokens,
            body.cache_salt,
            lora_request,
        )
        top = body.top_logprobs or 0
        try:
            if body.stream:
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                stream = self._stream(
                    handles, request_id, created, params.n, logprobs, top, include_usage, model
                )
                return self.stream_response(handles, stream)
            final = await run_until_disconnected(raw, self._last(handles))
            return JSONResponse(self._response(final, request_id, created, logprobs, top, model))
        except BaseException:
            self.abort_unfinished(handles)
            raise

    async def _last(self, handles) -> RequestOutput:
        last = None
        async with self.output_streams(handles) as outputs:
            async for _, out in outputs:
                last = out
        assert last is not None
        return last

    def _response(
        self, final: RequestOutput, request_id, created, logprobs, top, model: str
    ) -> dict:
        choices = []
        completion_tokens = 0
        for c in final.outputs:
            completion_tokens += len(c.token_ids)
            lp = None
            if logprobs is not None and c.logprobs is not None:
                lp = chat_logprobs(c.token_ids, c.logprobs, top)
            choices.append(
                ChatChoice(
                    index=c.index,
                    message=ChatResponseMessage(content=c.text),
                    logprobs=lp,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                )
            )
        prompt_tokens = len(final.prompt_token_ids)
        usage = UsageInfo.of(prompt_tokens, completion_tokens, final.num_cached_tokens)
        resp = ChatCompletionResponse(
            id=request_id, created=created, model=model, choices=choices, usage=usage
        )
        return resp.model_dump()

    async def _stream(
        self, handles, request_id, created, n, logprobs, top, include_usage, model: str
    ) -> AsyncIterator[str]:
        def chunk(choices, usage=None) -> str:
            return sse(
                ChatCompletionChunk(
                    id=request_id,
                    created=created,
                    model=model,
                    choices=choices,
                    usage=usage,
                ).model_dump()
            )

        prompt_tokens = completion_tokens = cached_tokens = 0
        try:
            async with self.output_streams(handles) as outputs:
                # OpenAI opens every choice with the assistant role and no
                # text; inside the stream's scope, so a client gone right
                # after it aborts the request.
                for i in range(n):
                    yield chunk(
                        [
                            ChatStreamChoice(
                                index=i, delta=DeltaMessage(role="assistant", content="")
                            )
                        ]
                    )
                async for _, ro in outputs:
                    prompt_tokens = len(ro.prompt_token_ids)
                    cached_tokens = ro.num_cached_tokens
                    for c in ro.outputs:
                        completion_tokens += len(c.token_ids)
                        lp = None
                        if logprobs is not None and c.logprobs is not None:
                            lp = chat_logprobs(c.token_ids, c.logprobs, top)
                        yield chunk(
                            [
                                ChatStreamChoice(
                                    index=c.index,
                                    delta=DeltaMessage(content=c.text),
                                    logprobs=lp,
                                    finish_reason=c.finish_reason,
                                    stop_reason=c.stop_reason,
                                )
                            ]
                        )
                if include_usage:
                    usage = UsageInfo.of(prompt_tokens, completion_tokens, cached_tokens)
                    yield chunk([], usage)
        except EngineDeadError as exc:
            yield sse_error(f"the engine is not running: {exc}", 503)
        yield SSE_DONE
