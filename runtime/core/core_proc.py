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

No thread dies silently: any exception in the input thread (a malformed
frame, say) or the output thread fails the whole engine, with FAILED when the
output path still works and by exiting the process otherwise. A fourth,
tiny thread sends a HEARTBEAT every second carrying how long the busy loop
has been in its current iteration, so the front end notices a core that went
silent (frozen, IO dead) within seconds and one stuck in a step after its
step timeout.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback

import zmq
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.core.outputs import EngineCoreOutputs
from pagoda.runtime.core.wire import (
    ABORT,
    ADD,
    FAILED,
    HEARTBEAT,
    OUTPUTS,
    READY,
    SHUTDOWN,
    UTILITY,
    UTILITY_METHODS,
    UTILITY_RESULT,
    CoreInputDecoder,
    Encoder,
    Heartbeat,
    ReadyInfo,
    UtilityCall,
    UtilityResult,
)
from pagoda.runtime.sampling_params import InvalidRequestError

logger = logging.getLogger(__name__)

# How often the input thread checks that the parent is still alive.
_PARENT_POLL_MS = 500
# How long queued outputs (notably a FAILED message) may take to leave on exit.
_LINGER_MS = 2000
HEARTBEAT_INTERVAL_S = 1.0
# Bounded queues: a stalled consumer holds back its producer (and, through
# ZMQ's high-water marks, the API server) instead of growing memory. The input
# side is drained completely every iteration; the output side holds steps.
_INPUT_QUEUE_SIZE = 4096
_OUTPUT_QUEUE_SIZE = 256
# An IO thread failed and the main thread did not end the process in this
# long (stuck in a step): exit anyway.
_FATAL_EXIT_S = 5.0


class _Shutdown(Exception):
    """Raised in the main thread to leave the busy loop cleanly."""


def run_engine_core(
    config: EngineConfig,
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
    sys.exit(proc.run(config))


class EngineCoreProc:
    """Owns the sockets, the IO threads and the busy loop of one EngineCore."""

    def __init__(self, input_addr: str, output_addr: str, parent_pid: int):
        self.input_addr = input_addr
        self.output_addr = output_addr
        self.parent_pid = parent_pid
        self.input_queue: queue.Queue = queue.Queue(_INPUT_QUEUE_SIZE)
        self.output_queue: queue.Queue = queue.Queue(_OUTPUT_QUEUE_SIZE)
        self.ctx = zmq.Context()
        self._stop = threading.Event()
        # Set by an IO thread that failed: the busy loop raises it.
        self._fatal: str | None = None
        # When the busy loop began its current iteration (heartbeats report it).
        self._iteration_start = time.monotonic()

    def run(self, config: EngineConfig) -> int:
        out_thread = threading.Thread(target=self._output_loop, name="core-output", daemon=True)
        out_thread.start()
        in_thread = None
        engine = None
        status = 0
        try:
            engine = self._start_engine(config)
            if engine is None:
                status = 1
            else:
                in_thread = threading.Thread(
                    target=self._input_loop, name="core-input", daemon=True
                )
                in_thread.start()
                threading.Thread(
                    target=self._heartbeat_loop, name="core-heartbeat", daemon=True
                ).start()
                status = self._busy_loop(engine)
        except _Shutdown:
            logger.info("shutting down (SIGTERM)")
        except Exception as exc:
            # Die visibly: the traceback in the log, the reason to the front end.
            logger.exception("EngineCore died")
            self._put_output((FAILED, f"EngineCore died: {exc}".encode()), wait=False)
            status = 1
        finally:
            self._stop.set()
            if engine is not None:
                engine.shutdown()  # the worker processes, with tensor parallelism
            if in_thread is not None:
                in_thread.join(timeout=_PARENT_POLL_MS / 1000 + 1)
            self._put_output(None, wait=False)
            out_thread.join(timeout=_LINGER_MS / 1000 + 1)
            self.ctx.destroy(linger=_LINGER_MS)
        return status

    def _put_output(self, item, wait: bool = True) -> None:
        """Queue an output; while the queue is full, wait (back-pressure)
        unless an IO thread failed. `wait=False` (on the way out) gives up
        after a moment rather than block the exit."""
        deadline = None if wait else time.monotonic() + 1.0
        while True:
            try:
                self.output_queue.put(item, timeout=0.1)
                return
            except queue.Full:
                if self._fatal is not None and wait:
                    raise RuntimeError(self._fatal) from None
                if deadline is not None and time.monotonic() > deadline:
                    return

    def _fail(self, reason: str) -> None:
        """An IO thread failed: make the busy loop raise, and make sure the
        process ends even if the loop never comes back from its step."""
        logger.error("%s", reason)
        self._fatal = reason
        with contextlib.suppress(queue.Full):
            self.input_queue.put_nowait((None, None))  # wakes an idle loop
        timer = threading.Timer(_FATAL_EXIT_S, os._exit, (1,))
        timer.daemon = True
        timer.start()

    def _start_engine(self, config: EngineConfig):
        from pagoda.runtime.core.engine_core import EngineCore

        try:
            engine = EngineCore(config)
        except Exception as exc:
            logger.error("EngineCore failed to start: %s", exc)
            if not isinstance(exc, (ValueError, FileNotFoundError)):
                traceback.print_exc()
            self.output_queue.put((FAILED, str(exc).encode()))
            return None
        # This process lives for its engine: the start-up objects (weights'
        # metadata, the block pool's thousands of blocks) live as long, so
        # move them out of the collector's reach and full collections in the
        # step loop stay short (as vLLM does). Never in EngineCore itself: an
        # in-process engine (`LLM`) would freeze its caller's heap, and the
        # model's reference cycles would outlive the engine (~0.6 GB each).
        gc.collect()
        gc.freeze()
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
        # A tensor-parallel worker that dies fails the loop like a failed IO
        # thread: an idle loop sees it within a second, not at the next request.
        engine.executor.register_failure_callback(self._fail)
        while True:
            self._iteration_start = time.monotonic()
            if self._fatal is not None:
                raise RuntimeError(self._fatal)
            block = not engine.has_unfinished_requests()
            while True:
                try:
                    # Idle: wake now and then, so a failed IO thread is seen.
                    kind, obj = self.input_queue.get(block=block, timeout=1.0 if block else None)
                except queue.Empty:
                    if block:
                        self._iteration_start = time.monotonic()
                        if self._fatal is not None:
                            raise RuntimeError(self._fatal) from None
                        continue
                    break
                block = False
                if kind is None:
                    raise RuntimeError(self._fatal or "an IO thread failed")
                if kind == SHUTDOWN:
                    logger.info("shutting down (requested by the front end)")
                    return 0
                if kind == ADD:
                    self._add(engine, obj)
                elif kind == ABORT:
                    engine.abort_requests(obj)
                elif kind == UTILITY:
                    self._utility(engine, obj)
            self._put_output((OUTPUTS, engine.step()))

    def _add(self, engine, req) -> None:
        from pagoda.runtime.core.outputs import EngineCoreOutput
        from pagoda.runtime.core.request import FinishReason

        try:
            engine.add_request(req)
        except ValueError as exc:
            # The front end validated already; a refusal here (duplicate id)
            # must still finish that request rather than leave it hanging.
            logger.warning("refused request %s: %s", req.request_id, exc)
            self._put_output(
                (
                    OUTPUTS,
                    EngineCoreOutputs(
                        [EngineCoreOutput(req.request_id, [], None, FinishReason.ABORT)]
                    ),
                )
            )
            return

    def _utility(self, engine, call: UtilityCall) -> None:
        """Run one front-end call between steps and answer it. A refusal
        (InvalidRequestError: a bad adapter folder) is the caller's; other
        errors are answered too, and change nothing (loading an adapter is
        all or nothing), so the engine serves on."""
        result = UtilityResult(call.call_id)
        try:
            if call.method not in UTILITY_METHODS:
                raise InvalidRequestError(f"unknown engine call {call.method!r}", param="method")
            if call.method == "add_lora":
                engine.add_lora(call.lora_request)
            else:
                engine.remove_lora(call.lora_int_id)
        except InvalidRequestError as exc:
            result.error, result.param = str(exc), exc.param
        except Exception as exc:
            logger.exception("engine call %s failed", call.method)
            result.error = f"{call.method} failed: {exc!r}"
        self._put_output((UTILITY_RESULT, Encoder().encode(result)))

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
                    if self._parent_gone():
                        return
                    continue
                message = decoder.decode(sock.recv_multipart())
                while not self._stop.is_set():
                    try:
                        self.input_queue.put(message, timeout=_PARENT_POLL_MS / 1000)
                        break
                    except queue.Full:
                        if self._parent_gone():
                            return
        except Exception as exc:
            if not self._stop.is_set():
                logger.exception("EngineCore input thread failed")
                self._fail(f"EngineCore input thread failed: {exc!r}")
        finally:
            sock.close(linger=0)

    def _parent_gone(self) -> bool:
        if os.getppid() == self.parent_pid:
            return False
        logger.error("the API server process is gone; exiting")
        with contextlib.suppress(queue.Full):
            self.input_queue.put_nowait((SHUTDOWN, None))
        return True

    def _output_loop(self) -> None:
        sock = self.ctx.socket(zmq.PUSH)
        sock.connect(self.output_addr)
        encoder = Encoder()
        try:
            while True:
                item = self.output_queue.get()
                if item is None:
                    break
                sock.send_multipart(self._encode(encoder, item), copy=False)
        except Exception as exc:
            logger.exception("EngineCore output thread failed")
            reason = f"EngineCore output thread failed: {exc!r}"
            # The socket may still work (an encoding error): say why we die.
            with contextlib.suppress(Exception):
                sock.send_multipart([FAILED, reason.encode()], flags=zmq.NOBLOCK)
            self._fail(reason)
        finally:
            sock.close(linger=_LINGER_MS)

    @staticmethod
    def _encode(encoder: Encoder, item: tuple) -> list:
        kind = item[0]
        if kind == OUTPUTS:
            return [OUTPUTS, encoder.encode(item[1])]
        return [kind, item[1]]

    def _heartbeat_loop(self) -> None:
        """Every second, whatever the load: the core is alive, and its loop has
        been in its current iteration this long."""
        encoder = Encoder()
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            stalled = time.monotonic() - self._iteration_start
            with contextlib.suppress(queue.Full):
                self.output_queue.put_nowait((HEARTBEAT, encoder.encode(Heartbeat(stalled))))
