"""The front end's handle on the EngineCore process.

It spawns the process, owns both ZMQ sockets (bound here, on ipc:// paths in a
private temporary folder, so the files go away with the folder), sends requests
and aborts, and receives outputs. A `ProcessWatch` thread waits for the
process, so a killed engine core is noticed at once, not at the next timeout: `get_output()` then raises `EngineDeadError`. A hung core is noticed
through its heartbeats: silent for `heartbeat_timeout` seconds (frozen, or its
IO threads gone), or stuck in one iteration of its loop for `step_timeout`
seconds; it is then marked dead and killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import zmq
import zmq.asyncio
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.core.core_proc import run_engine_core
from pagoda.runtime.core.outputs import EngineCoreOutputs, EngineCoreRequest
from pagoda.runtime.core.wire import (
    ABORT,
    ADD,
    FAILED,
    HEARTBEAT,
    OUTPUTS,
    READY,
    SHUTDOWN,
    UTILITY,
    UTILITY_RESULT,
    CoreOutputDecoder,
    Encoder,
    ReadyInfo,
    UtilityCall,
)
from pagoda.runtime.lora.request import LoRARequest
from pagoda.runtime.process_watch import ProcessWatch
from pagoda.runtime.sampling_params import InvalidRequestError

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The EngineCore process is gone; no request can be served."""


class EngineStartupError(RuntimeError):
    """The EngineCore process could not start; the message says why."""


def default_core_threads(num_cpus: int) -> int:
    """torch threads for a CPU EngineCore that shares the machine with its
    API server: every core it may run on, as llama-server takes.

    The API process needs little CPU (1.2 ms per streamed token at
    concurrency 1, 3% of a core), and since the forward became C++ kernels
    replayed from a graph, giving it a core of its own costs far more than
    it saves: on 2 cores, 2 engine threads against 1 measured 73 against 43
    output tok/s at concurrency 16 and 36 against 54 ms TPOT at
    concurrency 1 (docs/benchmarks.md). (On the old eager path, with
    hundreds of short torch ops per step, 1 thread had won.)"""
    return max(1, num_cpus)


class EngineCoreClient:
    """Async client of one EngineCore process (TP=1: the worker lives in it)."""

    def __init__(
        self,
        config: EngineConfig,
        num_threads: int | None = None,
        log_level: str = "INFO",
        heartbeat_timeout: float | None = 10.0,
        step_timeout: float | None = 300.0,
        process_target: Callable[..., None] = run_engine_core,
    ):
        """`process_target` is the core process's entry point (tests swap in
        one with a fault injected). `config` is shipped to the core as is:
        it resolves nothing again."""
        self.config = config
        self.heartbeat_timeout = heartbeat_timeout
        self.step_timeout = step_timeout
        self._last_message = time.monotonic()
        self._stalled_s = 0.0
        self._watchdog: asyncio.Task | None = None
        self._tmpdir = tempfile.mkdtemp(prefix="pagoda-")
        self.input_addr = f"ipc://{self._tmpdir}/input.sock"
        self.output_addr = f"ipc://{self._tmpdir}/output.sock"
        self.ctx = zmq.asyncio.Context()
        self.input_socket = self.ctx.socket(zmq.PUSH)
        self.input_socket.bind(self.input_addr)
        self.output_socket = self.ctx.socket(zmq.PULL)
        self.output_socket.bind(self.output_addr)
        self._encoder = Encoder()
        self._decoder = CoreOutputDecoder()
        self.dead_reason: str | None = None
        self._closing = False
        self._dead_event: asyncio.Event | None = None
        # The output socket's receive being awaited, if any (see _recv).
        self._pending_recv: asyncio.Future | None = None
        self._recv_cancelled = False
        # spawn, not fork: the parent may have threads (tokenizers, uvicorn)
        # and must not hand a half-initialised torch to the child.
        ctx = multiprocessing.get_context("spawn")
        self.proc = ctx.Process(
            target=process_target,
            args=(config, self.input_addr, self.output_addr, os.getpid(), num_threads, log_level),
            name="EngineCore",
            daemon=True,
        )
        self.proc.start()
        # The only waiter on the process (see process_watch); it reports an
        # unexpected exit through the event loop once wait_ready has one.
        self._loop: asyncio.AbstractEventLoop | None = None
        self.process = ProcessWatch(self.proc, on_exit=self._on_process_exit)
        self.info: ReadyInfo | None = None
        # Utility calls waiting for their answer: call id -> future.
        self._calls: dict[int, asyncio.Future] = {}
        self._next_call = 0

    @property
    def socket_dir(self) -> str:
        return self._tmpdir

    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None

    async def wait_ready(self) -> ReadyInfo:
        """Wait for the core's READY; raise EngineStartupError if it fails or dies."""
        loop = asyncio.get_running_loop()
        self._dead_event = asyncio.Event()
        self._loop = loop
        if not self.process.alive:  # it died before there was a loop to tell
            self._on_process_exit(self.process.exitcode)
        recv = asyncio.ensure_future(self.output_socket.recv_multipart())
        died = asyncio.ensure_future(self._dead_event.wait())
        await asyncio.wait({recv, died}, return_when=asyncio.FIRST_COMPLETED)
        if not recv.done():
            recv.cancel()
            raise EngineStartupError(
                f"the EngineCore process exited with status {self.process.exitcode} during start-up"
            )
        died.cancel()
        kind, payload = self._decoder.decode(recv.result())
        if kind == FAILED:
            raise EngineStartupError(payload)
        assert kind == READY, kind
        self.info = payload
        self._last_message = time.monotonic()
        if self.heartbeat_timeout or self.step_timeout:
            self._watchdog = loop.create_task(self._watch_heartbeats())
        return payload

    async def _watch_heartbeats(self) -> None:
        """Mark the core dead (and kill it) once it is silent or stuck too long."""
        period = min(1.0, (self.heartbeat_timeout or 4.0) / 4)
        while self.dead_reason is None and not self._closing:
            await asyncio.sleep(period)
            silent = time.monotonic() - self._last_message
            reason = None
            # Messages may be waiting unread (our own loop was busy): that is
            # not the core's silence.
            if (
                self.heartbeat_timeout
                and silent > self.heartbeat_timeout
                and not self.output_socket.getsockopt(zmq.EVENTS) & zmq.POLLIN
            ):
                reason = f"the EngineCore sent nothing for {silent:.1f} s (hung)"
            elif self.step_timeout and self._stalled_s > self.step_timeout:
                reason = (
                    f"the EngineCore's loop has been stuck in one step for "
                    f"{self._stalled_s:.0f} s (hung)"
                )
            if reason is not None and not self._closing:
                self._mark_dead(reason)
                self.kill()

    def stop_watching(self) -> None:
        """Stop the heartbeat watchdog (from the event loop's thread)."""
        if self._watchdog is not None:
            self._watchdog.cancel()

    def kill(self) -> None:
        """SIGKILL the core (a hung process would ignore SHUTDOWN and SIGTERM)."""
        self.process.kill()

    def _on_process_exit(self, exitcode: int | None) -> None:
        """From the watch thread (or wait_ready): tell the event loop."""
        loop = self._loop
        if self._closing or loop is None:
            return
        reason = f"the EngineCore process exited unexpectedly (status {exitcode})"
        # A closed loop (RuntimeError) means nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._mark_dead, reason)

    def _mark_dead(self, reason: str) -> None:
        if self.dead_reason is None:
            logger.error("%s", reason)
            self.dead_reason = reason
        if self._dead_event is not None:
            self._dead_event.set()
        # Wake the output reader: it waits on the socket alone.
        pending = self._pending_recv
        if pending is not None and not pending.done():
            self._recv_cancelled = True
            pending.cancel()

    async def call_utility(
        self, method: str, lora_request: LoRARequest | None = None, lora_int_id: int = 0
    ) -> None:
        """Run an EngineCore method between two of its steps and wait for it.

        Raises InvalidRequestError (the core refused: a bad adapter),
        RuntimeError (it failed, changing nothing) or EngineDeadError. The
        answer arrives on the output socket, read by whoever reads outputs
        (`get_output`), so a call needs the output loop running.
        """
        self._check_alive()
        self._next_call += 1
        call_id = self._next_call
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        call = UtilityCall(call_id, method, lora_request, lora_int_id)
        try:
            await self.input_socket.send_multipart([UTILITY, self._encoder.encode(call)])
            died = asyncio.ensure_future(self._dead_event.wait())
            try:
                await asyncio.wait({future, died}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                died.cancel()
            self._check_alive()
        finally:
            self._calls.pop(call_id, None)
        result = future.result()
        if result.error is not None:
            if result.param is not None:
                raise InvalidRequestError(result.error, param=result.param)
            raise RuntimeError(result.error)

    async def add_request(self, req: EngineCoreRequest) -> None:
        self._check_alive()
        await self.input_socket.send_multipart([ADD, self._encoder.encode(req)], copy=False)

    async def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and not self.is_dead and not self._closing:
            await self.input_socket.send_multipart([ABORT, self._encoder.encode(request_ids)])

    async def get_output(self) -> EngineCoreOutputs:
        """The next step's outputs; raises EngineDeadError once the core is gone."""
        while True:
            kind, payload = await self._recv()
            self._last_message = time.monotonic()
            if kind == HEARTBEAT:
                self._stalled_s = payload.stalled_s
                continue
            if kind == UTILITY_RESULT:
                future = self._calls.pop(payload.call_id, None)
                if future is not None and not future.done():
                    future.set_result(payload)
                continue
            if kind == FAILED:
                self._mark_dead(payload)
                self._check_alive()
            assert kind == OUTPUTS, kind
            self._stalled_s = 0.0
            return payload

    async def _recv(self) -> tuple[bytes, object]:
        """The next message. Every step's output passes here, so it waits on
        the socket's future alone (no task racing it per message): a death
        noticed elsewhere (`_mark_dead`) cancels that future instead."""
        self._check_alive()
        recv = self.output_socket.recv_multipart(copy=False)
        if not recv.done():
            self._pending_recv, self._recv_cancelled = recv, False
            try:
                await recv
            except asyncio.CancelledError:
                if self._recv_cancelled:  # by _mark_dead, not by our caller
                    raise EngineDeadError(self.dead_reason) from None
                raise
            finally:
                self._pending_recv = None
        frames = [f.bytes for f in recv.result()]
        return self._decoder.decode(frames)

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the core (SHUTDOWN, then SIGTERM, then SIGKILL) and remove the sockets.

        Synchronous and callable from any thread.
        """
        self._closing = True  # also ends the heartbeat watchdog
        try:
            if self.dead_reason is not None:
                self.kill()  # dead or hung: nothing left to shut down politely
            if self.process.alive:
                # A plain socket over the same handle: the asyncio wrapper
                # needs the event loop's thread, and this may run elsewhere.
                sync = zmq.Socket.shadow(self.input_socket.underlying)
                with contextlib.suppress(zmq.ZMQError):
                    sync.send_multipart([SHUTDOWN], flags=zmq.NOBLOCK)
            self.process.stop(timeout)
        finally:
            self.ctx.destroy(linger=0)
            shutil.rmtree(self._tmpdir, ignore_errors=True)
