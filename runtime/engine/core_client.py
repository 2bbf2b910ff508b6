"""The front end's handle on the EngineCore process.

It spawns the process, owns both ZMQ sockets (bound here, on ipc:// paths in a
private temporary folder, so the files go away with the folder), sends requests
and aborts, and receives outputs. A watcher thread waits on the process's
sentinel, so a killed engine core is noticed at once, not at the next
timeout: `get_output()` then raises `EngineDeadError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import threading

import zmq
import zmq.asyncio
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.core.core_proc import run_engine_core
from pagoda.runtime.core.outputs import EngineCoreOutputs, EngineCoreRequest
from pagoda.runtime.engine.serialization import (
    ABORT,
    ADD,
    FAILED,
    OUTPUTS,
    READY,
    SHUTDOWN,
    CoreOutputDecoder,
    Encoder,
    ReadyInfo,
    StepExtras,
)

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The EngineCore process is gone; no request can be served."""


class EngineStartupError(RuntimeError):
    """The EngineCore process could not start; the message says why."""


class EngineCoreClient:
    """Async client of one EngineCore process (TP=1: the worker lives in it)."""

    def __init__(self, args: EngineArgs, num_threads: int | None = None, log_level: str = "INFO"):
        self.args = args
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
        # spawn, not fork: the parent may have threads (tokenizers, uvicorn)
        # and must not hand a half-initialised torch to the child.
        ctx = multiprocessing.get_context("spawn")
        self.proc = ctx.Process(
            target=run_engine_core,
            args=(args, self.input_addr, self.output_addr, os.getpid(), num_threads, log_level),
            name="EngineCore",
            daemon=True,
        )
        self.proc.start()
        self.info: ReadyInfo | None = None

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
        threading.Thread(
            target=self._watch_process, args=(loop,), name="core-watcher", daemon=True
        ).start()
        recv = asyncio.ensure_future(self.output_socket.recv_multipart())
        died = asyncio.ensure_future(self._dead_event.wait())
        await asyncio.wait({recv, died}, return_when=asyncio.FIRST_COMPLETED)
        if not recv.done():
            recv.cancel()
            raise EngineStartupError(
                f"the EngineCore process exited with status {self.proc.exitcode} during start-up"
            )
        died.cancel()
        kind, payload = self._decoder.decode(recv.result())
        if kind == FAILED:
            raise EngineStartupError(payload)
        assert kind == READY, kind
        self.info = payload
        return payload

    def _watch_process(self, loop: asyncio.AbstractEventLoop) -> None:
        multiprocessing.connection.wait([self.proc.sentinel])
        if self._closing:
            return
        reason = f"the EngineCore process exited unexpectedly (status {self.proc.exitcode})"
        # A closed loop (RuntimeError) means nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._mark_dead, reason)

    def _mark_dead(self, reason: str) -> None:
        if self.dead_reason is None:
            logger.error("%s", reason)
            self.dead_reason = reason
        if self._dead_event is not None:
            self._dead_event.set()

    async def add_request(self, req: EngineCoreRequest) -> None:
        self._check_alive()
        await self.input_socket.send_multipart([ADD, self._encoder.encode(req)], copy=False)

    async def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and not self.is_dead and not self._closing:
            await self.input_socket.send_multipart([ABORT, self._encoder.encode(request_ids)])

    async def get_output(self) -> tuple[EngineCoreOutputs, StepExtras]:
        """The next step's outputs; raises EngineDeadError once the core is gone."""
        self._check_alive()
        recv = asyncio.ensure_future(self.output_socket.recv_multipart(copy=False))
        if not recv.done():
            died = asyncio.ensure_future(self._dead_event.wait())
            try:
                await asyncio.wait({recv, died}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                died.cancel()
            if not recv.done():
                recv.cancel()
                self._check_alive()
        frames = [f.bytes for f in recv.result()]
        kind, payload = self._decoder.decode(frames)
        if kind == FAILED:
            self._mark_dead(payload)
            self._check_alive()
        assert kind == OUTPUTS, kind
        return payload

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the core (SHUTDOWN, then SIGTERM, then SIGKILL) and remove the sockets.

        Synchronous and callable from any thread.
        """
        self._closing = True
        try:
            if self.proc.is_alive():
                # A plain socket over the same handle: the asyncio wrapper
                # needs the event loop's thread, and this may run elsewhere.
                sync = zmq.Socket.shadow(self.input_socket.underlying)
                with contextlib.suppress(zmq.ZMQError):
                    sync.send_multipart([SHUTDOWN], flags=zmq.NOBLOCK)
                self.proc.join(timeout)
            if self.proc.is_alive():
                logger.warning("EngineCore did not stop in %.0f s; sending SIGTERM", timeout)
                self.proc.terminate()
                self.proc.join(timeout)
            if self.proc.is_alive():
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.join()
        finally:
            self.ctx.destroy(linger=0)
            shutil.rmtree(self._tmpdir, ignore_errors=True)
