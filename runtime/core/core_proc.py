"""The EngineCore process: the busy loop behind the API server.

Three threads, as in vLLM V1: an input thread receives and decodes requests
and aborts from ZMQ, an output thread encodes and sends outputs, and the main
thread only steps the engine. The model loop thus never waits on a socket or
spends time in (de)serialisation while requests are running.

Life cycle: start-up errors and crashes of the loop are sent to the front end
as a FAILED message (with the error text) before the process exits non-zero,
so the API server can say what went wrong; SIGTERM or a SHUTDOWN message end
the loop cleanly; if the parent disappears (SIGKILLed), the input thread
notices and the process exits rather than live on as an orphan.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback

import zmq
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.core.outputs import EngineCoreOutputs
from pagoda.runtime.core.request import RequestStatus
from pagoda.runtime.engine.serialization import (
    ABORT,
    ADD,
    FAILED,
    OUTPUTS,
    READY,
    SHUTDOWN,
    CoreInputDecoder,
    Encoder,
    ReadyInfo,
    StepExtras,
)
from pagoda.runtime.executor.abstract import WorkerDiedError

logger = logging.getLogger(__name__)

# How often the input thread checks that the parent is still alive.
_PARENT_POLL_MS = 500
# How long queued outputs (notably a FAILED message) may take to leave on exit.
_LINGER_MS = 2000


# Put on the input queue by the executor's monitor thread.
_EXECUTOR_FAILED = b"executor-failed"


class _Shutdown(Exception):
    """Raised in the main thread to leave the busy loop cleanly."""


def run_engine_core(
    args: EngineArgs,
    input_addr: str,
    output_addr: str,
    parent_pid: int,
    num_threads: int | None = None,
    log_level: str = "INFO",
) -> None:
    """Entry point of the spawned process; never returns (exits with a status)."""
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s EngineCore %(name)s: %(message)s",
    )
    # Ctrl-C reaches the whole process group; the API server decides how the
    # engine stops, so this process ignores SIGINT and obeys SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def on_sigterm(signum, frame):
        raise _Shutdown()

    signal.signal(signal.SIGTERM, on_sigterm)
    if num_threads:
        import torch

        torch.set_num_threads(num_threads)
    proc = EngineCoreProc(input_addr, output_addr, parent_pid)
    sys.exit(proc.run(args))


class EngineCoreProc:
    """Owns the sockets, the IO threads and the busy loop of one EngineCore."""

    def __init__(self, input_addr: str, output_addr: str, parent_pid: int):
        self.input_addr = input_addr
        self.output_addr = output_addr
        self.parent_pid = parent_pid
        self.input_queue: queue.Queue = queue.Queue()
        self.output_queue: queue.Queue = queue.Queue()
        self.ctx = zmq.Context()
        self._stop = threading.Event()
        # Requests not yet scheduled: their first scheduling time is reported
        # once (queue-time metric).
        self._unscheduled: set[str] = set()

    def run(self, args: EngineArgs) -> int:
        out_thread = threading.Thread(target=self._output_loop, name="core-output", daemon=True)
        out_thread.start()
        in_thread = None
        engine = None
        status = 0
        try:
            engine = self._start_engine(args)
            if engine is None:
                status = 1
            else:
                in_thread = threading.Thread(
                    target=self._input_loop, name="core-input", daemon=True
                )
                in_thread.start()
                status = self._busy_loop(engine)
        except _Shutdown:
            logger.info("shutting down (SIGTERM)")
        except Exception as exc:
            # Die visibly: the traceback in the log, the reason to the front end.
            logger.exception("EngineCore died")
            self.output_queue.put((FAILED, f"EngineCore died: {exc!r}".encode()))
            status = 1
        finally:
            self._stop.set()
            if engine is not None:
                engine.shutdown()  # the worker processes, with tensor parallelism
            if in_thread is not None:
                in_thread.join(timeout=_PARENT_POLL_MS / 1000 + 1)
            self.output_queue.put(None)
            out_thread.join(timeout=_LINGER_MS / 1000 + 1)
            self.ctx.destroy(linger=_LINGER_MS)
        return status

    def _start_engine(self, args: EngineArgs):
        from pagoda.runtime.core.engine_core import EngineCore

        try:
            engine = EngineCore(args.create_engine_config())
        except Exception as exc:
            logger.error("EngineCore failed to start: %s", exc)
            if not isinstance(exc, (ValueError, FileNotFoundError)):
                traceback.print_exc()
            self.output_queue.put((FAILED, str(exc).encode()))
            return None
        mem = engine.memory
        info = ReadyInfo(
            max_model_len=engine.model_config.max_model_len,
            vocab_size=engine.model_config.vocab_size,
            num_kv_blocks=mem.num_blocks,
            block_size=mem.block_size,
            memory_summary=mem.summary(),
        )
        self.output_queue.put((READY, Encoder().encode(info)))
        return engine

    def _busy_loop(self, engine) -> int:
        """Pull inputs (blocking only while idle), step, push outputs."""
        scheduler = engine.scheduler
        # A tensor-parallel worker that dies wakes an idle loop through the
        # queue, so the front end hears of it at once, not at the next request.
        engine.executor.register_failure_callback(
            lambda reason: self.input_queue.put((_EXECUTOR_FAILED, reason))
        )
        while True:
            block = not engine.has_unfinished_requests()
            while True:
                try:
                    kind, obj = self.input_queue.get(block=block)
                except queue.Empty:
                    break
                block = False
                if kind == SHUTDOWN:
                    logger.info("shutting down (requested by the front end)")
                    return 0
                if kind == _EXECUTOR_FAILED:
                    raise WorkerDiedError(obj)
                if kind == ADD:
                    self._add(engine, obj)
                elif kind == ABORT:
                    engine.abort_requests(obj)
                    self._unscheduled.difference_update(obj)
            step_start = time.monotonic()
            outputs = engine.step()
            scheduled = self._newly_scheduled(scheduler, step_start)
            self.output_queue.put((OUTPUTS, outputs, StepExtras(scheduled)))

    def _add(self, engine, req) -> None:
        from pagoda.runtime.core.outputs import EngineCoreOutput
        from pagoda.runtime.core.request import FinishReason

        try:
            engine.add_request(req)
        except ValueError as exc:
            # The front end validated already; a refusal here (duplicate id)
            # must still finish that request rather than leave it hanging.
            logger.warning("refused request %s: %s", req.request_id, exc)
            self.output_queue.put(
                (
                    OUTPUTS,
                    EngineCoreOutputs(
                        [EngineCoreOutput(req.request_id, [], None, FinishReason.ABORT)]
                    ),
                    StepExtras(),
                )
            )
            return
        self._unscheduled.add(req.request_id)

    def _newly_scheduled(self, scheduler, now: float) -> dict[str, float]:
        if not self._unscheduled:
            return {}
        found = {}
        for rid in list(self._unscheduled):
            req = scheduler.requests.get(rid)
            if req is None or req.status != RequestStatus.WAITING:
                self._unscheduled.discard(rid)
                found[rid] = now
        return found

    # -- IO threads ------------------------------------------------------------

    def _input_loop(self) -> None:
        sock = self.ctx.socket(zmq.PULL)
        sock.connect(self.input_addr)
        decoder = CoreInputDecoder()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if not poller.poll(_PARENT_POLL_MS):
                    if os.getppid() != self.parent_pid:
                        logger.error("the API server process is gone; exiting")
                        self.input_queue.put((SHUTDOWN, None))
                        return
                    continue
                self.input_queue.put(decoder.decode(sock.recv_multipart()))
        except zmq.ZMQError:
            if not self._stop.is_set():
                raise
        finally:
            sock.close(linger=0)

    def _output_loop(self) -> None:
        sock = self.ctx.socket(zmq.PUSH)
        sock.connect(self.output_addr)
        encoder = Encoder()
        try:
            while True:
                item = self.output_queue.get()
                if item is None:
                    break
                kind = item[0]
                if kind == OUTPUTS:
                    sock.send_multipart(
                        [OUTPUTS, encoder.encode(item[1]), encoder.encode(item[2])], copy=False
                    )
                else:
                    sock.send_multipart([kind, item[1]])
        finally:
            sock.close(linger=_LINGER_MS)
