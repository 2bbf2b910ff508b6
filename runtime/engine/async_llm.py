"""AsyncLLM: the API server's engine, the async multi-process twin of `LLMEngine`.

The front end (tokenization, the output processor with its incremental
detokenizers and stop strings) runs in this process on the event loop; the
EngineCore runs in its own process behind `EngineCoreClient`. One output
handler task reads every step's outputs, runs them through the same
`OutputProcessor` the offline engine uses, and fans them out to one queue per
request; `generate()` is an async generator over that queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pagoda.runtime.config import EngineArgs
from pagoda.runtime.core.outputs import EngineCoreOutputs, SchedulerStats
from pagoda.runtime.engine.core_client import (
    EngineCoreClient,
    EngineDeadError,
    default_core_threads,
)
from pagoda.runtime.engine.lora_registry import LoRARegistry
from pagoda.runtime.engine.output_collector import RequestOutputCollector
from pagoda.runtime.engine.output_processor import OutputKind, OutputProcessor, ProcessedOutputs
from pagoda.runtime.engine.processor import (
    InputProcessor,
    Prompt,
    log_generation_setup,
    resolve_eos_token_ids,
)
from pagoda.runtime.engine.tokenizer import load_tokenizer
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.outputs import RequestOutput
from pagoda.runtime.sampling_params import InvalidRequestError, SamplingParams

logger = logging.getLogger(__name__)


class EngineOverloadedError(RuntimeError):
    """Too many requests are waiting; the caller should retry later."""


@dataclass
class RequestHandle:
    """A submitted request: its pending output, and whether it has finished."""

    request_id: str
    collector: RequestOutputCollector
    finished: bool = False


# Text prompts longer than this many characters are tokenized in their own
# lane, so a long prompt never delays the short ones behind it.
LONG_PROMPT_CHARS = 16_384


class StatLogger(Protocol):
    """What AsyncLLM reports to (the server's Prometheus metrics implement it)."""

    def on_request_added(
        self, request_id: str, child_ids: list[str], num_prompt_tokens: int, arrival_time: float
    ) -> None: ...

    def on_step(self, outputs: EngineCoreOutputs, processed: ProcessedOutputs) -> None: ...

    def on_request_aborted(self, request_id: str) -> None: ...


class AsyncLLM:
    """Serve requests concurrently from an asyncio event loop.

    Build it with `await AsyncLLM.create(args)`; stop it with `shutdown()`.
    """

    def __init__(
        self,
        args: EngineArgs,
        client: EngineCoreClient,
        tokenizer: Any,
        model_config: Any,
        stat_logger: StatLogger | None = None,
        max_waiting_requests: int | None = None,
    ):
        self.args = args
        # Beyond this many engine-core requests waiting, add_request refuses.
        self.max_waiting_requests = max_waiting_requests
        self.client = client
        self.tokenizer = tokenizer
        self.model_config = model_config
        info = client.info
        assert info is not None
        self.max_model_len = info.max_model_len
        eos = resolve_eos_token_ids(model_config.eos_token_ids, tokenizer)
        self.processor = InputProcessor(tokenizer, info.max_model_len, info.vocab_size, eos)
        # The model's generation_config.json sampling defaults: what a request
        # that leaves a field unset gets (vLLM's --generation-config auto).
        self.default_sampling_params = dict(model_config.generation.sampling_defaults)
        log_generation_setup(eos, self.default_sampling_params)
        self.output_processor = OutputProcessor(tokenizer)
        self.stat_logger = stat_logger
        self.scheduler_stats = SchedulerStats()
        self._collectors: dict[str, RequestOutputCollector] = {}
        self._dead_callbacks: list[Callable[[EngineDeadError], None]] = []
        self.dead_error: EngineDeadError | None = None
        # Engine-core requests still in this process (being tokenized or
        # validated, or queued behind others): with the core's waiting count,
        # the queue depth an autoscaler needs.
        self.num_pending = 0
        # Tokenizing keeps the event loop (HTTP parsing, streaming) responsive
        # in worker threads. Two lanes of one thread each: short prompts keep
        # their arrival order in one, and a long prompt, in the other, never
        # delays them.
        self._short_lane = concurrent.futures.ThreadPoolExecutor(1, "tokenize")
        self._long_lane = concurrent.futures.ThreadPoolExecutor(1, "tokenize-long")
        # No text longer than this can fit the context: each token covers at
        # most the longest vocabulary entry's characters. Refusing by length
        # first means an 8 MB prompt is never tokenized at all.
        self.max_prompt_chars = max_prompt_chars(tokenizer, self.max_model_len)
        # Adapters by name (the server sets it up when LoRA is on).
        self.lora_registry: LoRARegistry | None = None
        self._handler = asyncio.get_running_loop().create_task(self._output_handler())
        self._background: set[asyncio.Task] = set()

    @classmethod
    async def create(
        cls,
        args: EngineArgs,
        stat_logger: StatLogger | None = None,
        num_threads: int | None = None,
        log_level: str = "INFO",
        heartbeat_timeout: float | None = 10.0,
        step_timeout: float | None = 300.0,
    ) -> AsyncLLM:
        """Start the EngineCore process and load the tokenizer meanwhile.

        The core counts as hung (dead) when silent for `heartbeat_timeout`
        seconds, or stuck in one step for `step_timeout` (None: never)."""
        # Resolved once, here: it reads only metadata (fast) and raises, naming
        # the field, before a process is spawned for a model that does not
        # exist; the core receives the result and resolves nothing again.
        config = args.create_engine_config()
        model_config = config.model_config
        if (
            num_threads is None
            and model_config.device.type == "cpu"
            and config.parallel_config.world_size == 1
        ):
            num_threads = default_core_threads(len(os.sched_getaffinity(0)))
        client = EngineCoreClient(
            config,
            num_threads=num_threads,
            log_level=log_level,
            heartbeat_timeout=heartbeat_timeout,
            step_timeout=step_timeout,
        )
        try:
            tok_src = model_config.tokenizer
            # A task, so the tokenizer loads while the core loads the model.
            tokenizer_task = (
                asyncio.ensure_future(asyncio.to_thread(load_tokenizer, *tok_src))
                if tok_src
                else None
            )
            info = await client.wait_ready()
            tokenizer = await tokenizer_task if tokenizer_task else None
        except BaseException:
            client.shutdown()
            raise
        logger.info("Memory: %s", info.memory_summary)
        return cls(args, client, tokenizer, model_config, stat_logger)

    # -- requests ----------------------------------------------------------------

    @property
    def is_dead(self) -> bool:
        return self.dead_error is not None or self.client.is_dead

    def num_waiting_estimate(self) -> int:
        """Engine-core requests waiting to be scheduled, as far as we know now.

        The core's own count lags by a step and misses requests sent since,
        so take the larger of it and what our in-flight count implies: at
        most max_num_seqs of them can be running.
        """
        in_flight = len(self.output_processor.states)
        implied = in_flight - self.args.max_num_seqs
        return max(0, implied, min(self.scheduler_stats.num_waiting_reqs, in_flight))

    def on_dead(self, callback: Callable[[EngineDeadError], None]) -> None:
        """Call `callback` once if the engine core dies."""
        self._dead_callbacks.append(callback)

    def check_prompt_length(self, prompt: Prompt, param: str = "prompt") -> None:
        """Refuse a text that cannot fit the context, by its length alone."""
        limit = self.max_prompt_chars
        if isinstance(prompt, str) and limit is not None and len(prompt) > limit:
            raise InvalidRequestError(
                f"{param} has {len(prompt)} characters; this model's maximum context "
                f"length is {self.max_model_len} tokens, which no text longer than "
                f"{limit} characters fits",
                param=param,
            )

    def _lane(self, prompt: Prompt) -> concurrent.futures.Executor:
        long = isinstance(prompt, str) and len(prompt) > LONG_PROMPT_CHARS
        return self._long_lane if long else self._short_lane

    async def tokenize(self, prompt: Prompt, add_special_tokens: bool = True) -> list[int]:
        self.check_prompt_length(prompt)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._lane(prompt), self.processor.tokenize, prompt, add_special_tokens
        )

    async def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        kind: OutputKind = OutputKind.DELTA,
        prompt_text: str | None = None,
        add_special_tokens: bool = True,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> RequestHandle:
        """Validate and submit one request; iterate its outputs with `outputs()`.

        Raises, before anything is submitted: InvalidRequestError (naming the
        field), EngineOverloadedError (more than `max_waiting_requests`
        waiting), EngineDeadError. A server calls this before it starts a
        response, so these become HTTP errors rather than broken streams.
        """
        handles = await self.add_requests(
            [request_id],
            [prompt],
            params,
            kind,
            [prompt_text],
            add_special_tokens,
            cache_salt,
            lora_request,
        )
        return handles[0]

    async def add_requests(
        self,
        request_ids: list[str],
        prompts: list[Prompt],
        params: SamplingParams,
        kind: OutputKind = OutputKind.DELTA,
        prompt_texts: list[str | None] | None = None,
        add_special_tokens: bool = True,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> list[RequestHandle]:
        """Submit several prompts, all or none: if one is refused, those
        already submitted are aborted and forgotten, and the error is raised.
        `lora_request` (from `lora_registry.get`) runs them with an adapter."""
        self._check_alive()
        limit = self.max_waiting_requests
        if limit is not None and len(prompts) * params.n > limit:
            raise InvalidRequestError(
                f"{len(prompts)} prompt(s) x n={params.n} = {len(prompts) * params.n} "
                f"sequences can never be queued here (--max-waiting-requests {limit})",
                param="n",
            )
        for prompt in prompts:
            self.check_prompt_length(prompt)
        texts = prompt_texts or [None] * len(prompts)
        handles: list[RequestHandle] = []
        unsubmitted = len(prompts) * params.n
        self.num_pending += unsubmitted
        try:
            for rid, prompt, text in zip(request_ids, prompts, texts):
                handles.append(
                    await self._add_one(
                        rid,
                        prompt,
                        params,
                        kind,
                        text,
                        add_special_tokens,
                        cache_salt,
                        lora_request,
                    )
                )
                self.num_pending -= params.n
                unsubmitted -= params.n
        except BaseException:
            for handle in handles:
                self.abort_soon(handle.request_id)
            raise
        finally:
            self.num_pending -= unsubmitted
        return handles

    async def _add_one(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        kind: OutputKind,
        prompt_text: str | None,
        add_special_tokens: bool,
        cache_salt: str | None,
        lora_request: LoRARequest | None = None,
    ) -> RequestHandle:
        if request_id in self._collectors or request_id in self.output_processor.parents:
            # Checked before anything is registered: the request that owns
            # the id must keep its outputs.
            raise ValueError(f"request id {request_id!r} is already in use")
        loop = asyncio.get_running_loop()
        token_ids, core_req = await loop.run_in_executor(
            self._lane(prompt),
            functools.partial(
                self.processor.process,
                request_id,
                prompt,
                params,
                add_special_tokens=add_special_tokens,
                cache_salt=cache_salt,
                lora_request=lora_request,
            ),
        )
        self._check_alive()
        self._check_fits(len(token_ids), params)
        # No await from this check to the registration below, so concurrent
        # requests cannot all pass the check before any of them counts.
        limit = self.max_waiting_requests
        if limit is not None and self.num_waiting_estimate() + params.n > limit:
            raise EngineOverloadedError(
                f"the server is overloaded: {self.num_waiting_estimate()} requests are "
                f"already waiting (limit {limit}); retry later"
            )
        if request_id in self._collectors or request_id in self.output_processor.parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        if prompt_text is None and isinstance(prompt, str):
            prompt_text = prompt
        handle = RequestHandle(request_id, RequestOutputCollector(kind is OutputKind.DELTA))
        children = self.output_processor.add_request(
            request_id, prompt_text, token_ids, params, kind, core_req.arrival_time
        )
        self._collectors[request_id] = handle.collector
        if self.lora_registry is not None:
            self.lora_registry.request_started(request_id, lora_request)
        if self.stat_logger is not None:
            self.stat_logger.on_request_added(
                request_id, [c for c, _ in children], len(token_ids), core_req.arrival_time
            )
        try:
            for child_id, child_params in children:
                await self.client.add_request(
                    dataclasses.replace(core_req, request_id=child_id, sampling_params=child_params)
                )
        except BaseException:
            self.abort_soon(request_id)
            raise
        return handle

    def _check_fits(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Refuse (400, permanent) a request whose samples can never be in the
        KV cache together: retrying it later would not help."""
        info = self.client.info
        if info is None or params.n == 1:
            return  # one sequence of max_model_len always fits (checked at start-up)
        bs = info.block_size
        max_new = self.max_model_len - num_prompt_tokens
        if params.max_tokens is not None:
            max_new = min(max_new, params.max_tokens)
        # Full prompt blocks are shared through the prefix cache; each sample
        # has its own last prompt block and its generated tokens.
        shared = num_prompt_tokens // bs
        per_sample = -(-(num_prompt_tokens % bs + max_new) // bs)
        needed = shared + params.n * per_sample
        if needed > info.num_kv_blocks:
            raise InvalidRequestError(
                f"n={params.n} samples of up to {max_new} tokens after a prompt of "
                f"{num_prompt_tokens} tokens need {needed * bs} tokens of KV cache, more "
                f"than this server holds ({info.num_kv_blocks * bs}); lower n or max_tokens",
                param="n",
            )

    async def outputs(self, handle: RequestHandle) -> AsyncIterator[RequestOutput]:
        """Yield a submitted request's outputs until it finishes.

        Leaving the iteration early (a client disconnect cancels it) aborts
        the request in the engine core, which frees its KV blocks. Raises
        EngineDeadError if the engine core dies meanwhile.
        """
        try:
            while True:
                out = await handle.collector.get()
                handle.finished = out.finished
                yield out
                if handle.finished:
                    return
        finally:
            self._collectors.pop(handle.request_id, None)
            if not handle.finished:
                self.abort_soon(handle.request_id)

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str,
        kind: OutputKind = OutputKind.DELTA,
        prompt_text: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """`add_request` and `outputs` in one: the request's outputs as they come."""
        handle = await self.add_request(request_id, prompt, params, kind, prompt_text)
        async for out in self.outputs(handle):
            yield out

    @property
    def num_requests(self) -> int:
        """Requests this process holds an output collector for."""
        return len(self._collectors)

    def _forget(self, request_id: str) -> list[str]:
        """Drop a request from this process at once; its engine-core ids to abort."""
        self._collectors.pop(request_id, None)
        if self.lora_registry is not None:
            self.lora_registry.request_done(request_id)
        ids = self.output_processor.abort_request(request_id)
        if ids and self.stat_logger is not None:
            self.stat_logger.on_request_aborted(request_id)
        return ids

    async def abort(self, request_id: str) -> None:
        """Stop a request; its blocks are freed by the engine core."""
        await self.client.abort_requests(self._forget(request_id))

    def abort_soon(self, request_id: str) -> None:
        """`abort` without awaiting (for `finally` blocks of cancelled code):
        this process forgets the request now; the core is told right after."""
        ids = self._forget(request_id)
        if ids:
            task = asyncio.get_running_loop().create_task(self.client.abort_requests(ids))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _check_alive(self) -> None:
        if self.dead_error is not None:
            raise self.dead_error
        if self.client.is_dead:
            raise EngineDeadError(self.client.dead_reason)

    # -- the output handler ---------------------------------------------------------

    async def _output_handler(self) -> None:
        try:
            while True:
                outputs = await self.client.get_output()
                processed = self.output_processor.process_outputs(outputs)
                for ro in processed.request_outputs:
                    collector = self._collectors.get(ro.request_id)
                    if collector is not None:
                        collector.put(ro)
                    if ro.finished and self.lora_registry is not None:
                        self.lora_registry.request_done(ro.request_id)
                if processed.reqs_to_abort:
                    await self.client.abort_requests(processed.reqs_to_abort)
                if outputs.scheduler_stats is not None:
                    self.scheduler_stats = outputs.scheduler_stats
                if self.stat_logger is not None:
                    self.stat_logger.on_step(outputs, processed)
        except EngineDeadError as exc:
            self._fail_all(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("output handler failed")
            self._fail_all(EngineDeadError(f"output handler failed: {exc!r}"))

    def _fail_all(self, exc: EngineDeadError) -> None:
        self.dead_error = exc
        for collector in self._collectors.values():
            collector.put(exc)
        for callback in self._dead_callbacks:
            callback(exc)

    async def shutdown(self) -> None:
        """Stop the output handler and the EngineCore process; idempotent."""
        self._handler.cancel()
        self.client.stop_watching()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._handler
        await asyncio.to_thread(self.client.shutdown)
        self._short_lane.shutdown(wait=False)
        self._long_lane.shutdown(wait=False)


def max_prompt_chars(tokenizer: Any | None, max_model_len: int) -> int | None:
    """Characters beyond which a text surely has max_model_len tokens or more.

    Every token stands for at most as many characters as its vocabulary entry
    has (byte-level entries spell one character per byte; added and special
    tokens are entries too), so a text of more than max_model_len times the
    longest entry cannot fit.
    """
    vocab = getattr(tokenizer, "get_vocab", None)
    if vocab is None:
        return None
    longest = max((len(token) for token in vocab()), default=0)
    return max_model_len * max(longest, 1)
