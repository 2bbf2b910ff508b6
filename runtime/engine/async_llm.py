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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pagoda.runtime.config import EngineArgs
from pagoda.runtime.core.outputs import EngineCoreOutputs, SchedulerStats
from pagoda.runtime.engine.core_client import EngineCoreClient, EngineDeadError
from pagoda.runtime.engine.output_processor import OutputKind, OutputProcessor, ProcessedOutputs
from pagoda.runtime.engine.processor import (
    InputProcessor,
    Prompt,
    log_generation_setup,
    resolve_eos_token_ids,
)
from pagoda.runtime.engine.serialization import StepExtras
from pagoda.runtime.engine.tokenizer import load_tokenizer
from pagoda.runtime.outputs import RequestOutput
from pagoda.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineOverloadedError(RuntimeError):
    """Too many requests are waiting; the caller should retry later."""


@dataclass
class RequestHandle:
    """A submitted request: its output queue, and whether it has finished."""

    request_id: str
    queue: asyncio.Queue
    finished: bool = False


class StatLogger(Protocol):
    """What AsyncLLM reports to (the server's Prometheus metrics implement it)."""

    def on_request_added(
        self, request_id: str, child_ids: list[str], num_prompt_tokens: int, arrival_time: float
    ) -> None: ...

    def on_step(
        self, outputs: EngineCoreOutputs, extras: StepExtras, processed: ProcessedOutputs
    ) -> None: ...

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
        self._queues: dict[str, asyncio.Queue] = {}
        self._dead_callbacks: list[Callable[[EngineDeadError], None]] = []
        self.dead_error: EngineDeadError | None = None
        # Tokenizing a long prompt takes milliseconds; a worker thread keeps
        # the event loop (HTTP parsing, streaming) responsive meanwhile. One
        # thread, so requests keep their arrival order.
        self._tokenize_pool = concurrent.futures.ThreadPoolExecutor(1, "tokenize")
        self._handler = asyncio.get_running_loop().create_task(self._output_handler())
        self._background: set[asyncio.Task] = set()

    @classmethod
    async def create(
        cls,
        args: EngineArgs,
        stat_logger: StatLogger | None = None,
        num_threads: int | None = None,
        log_level: str = "INFO",
    ) -> AsyncLLM:
        """Start the EngineCore process and load the tokenizer meanwhile."""
        args.validate()
        # Resolving reads only metadata (fast) and raises, naming the field,
        # before a process is spawned for a model that does not exist.
        model_config = args.create_engine_config().model_config
        client = EngineCoreClient(args, num_threads=num_threads, log_level=log_level)
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

    async def tokenize(self, prompt: Prompt, add_special_tokens: bool = True) -> list[int]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._tokenize_pool, self.processor.tokenize, prompt, add_special_tokens
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
    ) -> RequestHandle:
        """Validate and submit one request; iterate its outputs with `outputs()`.

        Raises, before anything is submitted: InvalidRequestError (naming the
        field), EngineOverloadedError (more than `max_waiting_requests`
        waiting), EngineDeadError. A server calls this before it starts a
        response, so these become HTTP errors rather than broken streams.
        """
        self._check_alive()
        loop = asyncio.get_running_loop()
        token_ids, core_req = await loop.run_in_executor(
            self._tokenize_pool,
            functools.partial(
                self.processor.process,
                request_id,
                prompt,
                params,
                add_special_tokens=add_special_tokens,
                cache_salt=cache_salt,
            ),
        )
        self._check_alive()
        # No await from this check to the registration below, so concurrent
        # requests cannot all pass the check before any of them counts.
        limit = self.max_waiting_requests
        if limit is not None and self.num_waiting_estimate() + params.n > limit:
            raise EngineOverloadedError(
                f"the server is overloaded: {self.num_waiting_estimate()} requests are "
                f"already waiting (limit {limit}); retry later"
            )
        if prompt_text is None and isinstance(prompt, str):
            prompt_text = prompt
        handle = RequestHandle(request_id, asyncio.Queue())
        self._queues[request_id] = handle.queue
        children = self.output_processor.add_request(
            request_id, prompt_text, token_ids, params, kind, core_req.arrival_time
        )
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
            self._queues.pop(request_id, None)
            self._abort_soon(request_id)
            raise
        return handle

    async def outputs(self, handle: RequestHandle) -> AsyncIterator[RequestOutput]:
        """Yield a submitted request's outputs until it finishes.

        Leaving the iteration early (a client disconnect cancels it) aborts
        the request in the engine core, which frees its KV blocks. Raises
        EngineDeadError if the engine core dies meanwhile.
        """
        queue = handle.queue
        try:
            while True:
                out = queue.get_nowait() if not queue.empty() else await queue.get()
                if isinstance(out, BaseException):
                    raise out
                handle.finished = out.finished
                yield out
                if handle.finished:
                    return
        finally:
            self._queues.pop(handle.request_id, None)
            if not handle.finished:
                self._abort_soon(handle.request_id)

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

    async def abort(self, request_id: str) -> None:
        """Stop a request; its blocks are freed by the engine core."""
        ids = self.output_processor.abort_request(request_id)
        if ids and self.stat_logger is not None:
            self.stat_logger.on_request_aborted(request_id)
        await self.client.abort_requests(ids)

    def _abort_soon(self, request_id: str) -> None:
        # Called from `finally` of a cancelled generator: it must not await.
        task = asyncio.get_running_loop().create_task(self.abort(request_id))
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
                outputs, extras = await self.client.get_output()
                processed = self.output_processor.process_outputs(outputs)
                for ro in processed.request_outputs:
                    queue = self._queues.get(ro.request_id)
                    if queue is not None:
                        queue.put_nowait(ro)
                if processed.reqs_to_abort:
                    await self.client.abort_requests(processed.reqs_to_abort)
                if outputs.scheduler_stats is not None:
                    self.scheduler_stats = outputs.scheduler_stats
                if self.stat_logger is not None:
                    self.stat_logger.on_step(outputs, extras, processed)
        except EngineDeadError as exc:
            self._fail_all(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("output handler failed")
            self._fail_all(EngineDeadError(f"output handler failed: {exc!r}"))

    def _fail_all(self, exc: EngineDeadError) -> None:
        self.dead_error = exc
        for queue in self._queues.values():
            queue.put_nowait(exc)
        for callback in self._dead_callbacks:
            callback(exc)

    async def shutdown(self) -> None:
        """Stop the output handler and the EngineCore process; idempotent."""
        self._handler.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._handler
        await asyncio.to_thread(self.client.shutdown)
        self._tokenize_pool.shutdown(wait=False)
