"""Tensor parallelism: one worker process per rank, driven by the engine core.

Each step the executor broadcasts one message to every rank through a
shared-memory ring (`shm_broadcast`): the `SchedulerOutput`, which carries
new requests in full and running ones as diffs (new block ids and counts),
plus the tokens rank 0 sampled in the previous step, which the other ranks
append to their persistent batches (only rank 0 samples). The message thus
grows with the number of running requests, never with their prompt lengths.
Every rank runs the forward (with its all-reduces and the logits gather);
rank 0 answers with the sampled tokens through its pipe.

Failure: a `ProcessWatch` thread waits on every worker process. A worker
that dies or raises fails the executor at once: the step in progress raises
`WorkerDiedError`, and the failure callback wakes the engine core even when
it is idle, so the server fails fast instead of hanging in a collective. No
orphan: every worker gets SIGKILL when the engine core dies (Linux
PR_SET_PDEATHSIG) and also watches its parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from pagoda.runtime.config import EngineConfig
from pagoda.runtime.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagoda.runtime.distributed.shm_broadcast import (
    BroadcastHandle,
    BroadcastReader,
    BroadcastTimeout,
    BroadcastWriter,
    parent_alive,
)
from pagoda.runtime.executor.abstract import Executor, WorkerDiedError
from pagoda.runtime.process_watch import ProcessWatch

logger = logging.getLogger(__name__)

# Messages on the broadcast ring.
_STEP, _RPC, _SHUTDOWN = "step", "rpc", "shutdown"
# How long start-up (model load on every rank) may take.
_STARTUP_TIMEOUT_S = 1800.0
# How long a worker may take to leave after SHUTDOWN before it is killed.
_STOP_TIMEOUT_S = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MultiprocExecutor(Executor):
    def __init__(self, config: EngineConfig):
        super().__init__(config)
        world = config.parallel_config.world_size
        self._failure: str | None = None
        self._failure_callbacks: list[Callable[[str], None]] = []
        self._closing = False
        # Tokens rank 0 sampled last step, for the other ranks' batches.
        self._last_sampled: dict[str, list[int]] = {}
        self.broadcast = BroadcastWriter(num_readers=world)
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        ctx = multiprocessing.get_context("spawn")
        # The engine core may itself be a daemon process (the API server
        # starts it so), and multiprocessing refuses children to daemons.
        # The workers are ours to stop: shutdown() does, their watches notice
        # their death, and they die with this process (PDEATHSIG).
        multiprocessing.current_process().daemon = False
        self.procs: list[multiprocessing.process.BaseProcess] = []
        # One ProcessWatch per worker is its only waiter; a death it reports
        # fails the executor (through a weak reference: the finalizer below
        # holds the watches, and must not keep the executor alive).
        self.workers: list[ProcessWatch] = []
        self.pipes: list[multiprocessing.connection.Connection] = []
        try:
            for rank in range(world):
                ours, theirs = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=worker_main,
                    args=(config, rank, init_method, self.broadcast.handle, theirs, os.getpid()),
                    name=f"Worker_TP{rank}",
                    daemon=True,
                )
                proc.start()
                theirs.close()
                self.procs.append(proc)
                self.workers.append(
                    ProcessWatch(proc, functools.partial(_worker_exited, weakref.ref(self), rank))
                )
                self.pipes.append(ours)
            # Each worker reports once its model is loaded (or why not).
            self._gather(range(world), timeout=_STARTUP_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        # An LLM dropped without shutdown() still stops its workers.
        self._finalizer = weakref.finalize(self, _stop_workers, self.workers, self.broadcast)
        logger.info("Started %d tensor-parallel workers (%s)", world, init_method)

    # -- the executor interface ------------------------------------------

    def collective_rpc(
        self, method: str, args: tuple = (), kwargs: dict | None = None
    ) -> list[Any]:
        self._send((_RPC, method, args, kwargs or {}))
        return self._gather(range(len(self.procs)))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self._send((_STEP, scheduler_output, self._last_sampled))
        (output,) = self._gather([0])
        self._last_sampled = output.sampled_token_ids
        return output

    def register_failure_callback(self, callback: Callable[[str], None]) -> None:
        """Call `callback(reason)` (from a watch thread) if a worker dies;
        at once if one already has."""
        self._failure_callbacks.append(callback)
        if self._failure is not None:
            callback(self._failure)

    def check_health(self) -> None:
        if self._failure is not None:
            raise WorkerDiedError(self._failure)

    @property
    def broadcast_stats(self) -> tuple[int, int]:
        """(messages, bytes) sent to the workers so far."""
        return self.broadcast.messages_sent, self.broadcast.bytes_sent

    def shutdown(self) -> None:
        if self._closing:
            return
        self._closing = True
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()  # runs _stop_workers, once
        else:  # start-up failed before the finalizer existed
            _stop_workers(self.workers, self.broadcast)
        for pipe in self.pipes:
            pipe.close()

    # -- plumbing ------------------------------------------------------------

    def _send(self, message: tuple) -> None:
        self.check_health()
        try:
            self.broadcast.send(message, alive=self._all_alive)
        except BroadcastTimeout as exc:
            self._fail(f"a tensor-parallel worker stopped reading: {exc}")
            self.check_health()

    def _gather(self, ranks, timeout: float | None = None) -> list[Any]:
        """The answers of `ranks`, in order. Raises WorkerDiedError as soon as
        any worker dies or reports an error, awaited or not: a failed rank
        would otherwise leave the others blocked in a collective."""
        wanted = list(ranks)
        results: dict[int, Any] = {}
        raised: list[BaseException] = []
        conn_rank = {id(conn): rank for rank, conn in enumerate(self.pipes)}
        watched = [*self.pipes, *(p.sentinel for p in self.procs)]
        while len(results) < len(wanted):
            ready = multiprocessing.connection.wait(watched, timeout)
            if not ready:
                self._fail(f"tensor-parallel workers did not answer in {timeout:.0f} s")
            for item in ready:
                rank = conn_rank.get(id(item))
                if rank is None:
                    continue  # a sentinel: handled below, after any error report
                status, payload = _recv(item)
                if status == "raise":  # a refused call, not a failed worker
                    raised.append(payload)
                elif status != "ok":
                    self._fail(f"tensor-parallel worker {rank} failed: {payload}")
                # Only awaited ranks answer "ok" (the others speak only to fail).
                results[rank] = payload
            dead = [r for r, p in enumerate(self.procs) if p.sentinel in ready]
            if dead:
                self.workers[dead[0]].wait(1.0)  # the sentinel closes just before
                self._fail(
                    f"tensor-parallel worker {dead[0]} died "
                    f"(exit code {self.workers[dead[0]].exitcode})"
                )
        if raised:
            raise raised[0]
        return [results[rank] for rank in wanted]

    def _all_alive(self) -> bool:
        return all(w.alive for w in self.workers)

    def _fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
            logger.error("%s", reason)
            for callback in self._failure_callbacks:
                callback(reason)
        raise WorkerDiedError(self._failure)


def _worker_exited(executor_ref: weakref.ref, rank: int, exitcode: int | None) -> None:
    """A worker's ProcessWatch saw it exit: fail the executor, unless it is
    being shut down (or gone)."""
    executor = executor_ref()
    if executor is None or executor._closing:
        return
    with contextlib.suppress(WorkerDiedError):
        executor._fail(f"tensor-parallel worker {rank} died (exit code {exitcode})")


def _recv(pipe) -> tuple[str, Any]:
    try:
        return pipe.recv()
    except (EOFError, OSError) as exc:
        return "error", f"its pipe closed ({exc!r})"


def _stop_workers(workers: list[ProcessWatch], broadcast: BroadcastWriter) -> None:
    """Ask every worker to leave, then SIGTERM and SIGKILL those that stay;
    free the ring."""
    if workers and all(w.alive for w in workers):
        with contextlib.suppress(Exception):
            broadcast.send((_SHUTDOWN,), timeout=1.0)
    for worker in workers:
        worker.stop(_STOP_TIMEOUT_S)
    with contextlib.suppress(Exception):
        broadcast.close()


# -- the worker process -------------------------------------------------------


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def worker_main(
    config: EngineConfig,
    rank: int,
    init_method: str,
    handle: BroadcastHandle,
    pipe: multiprocessing.connection.Connection,
    parent_pid: int,
) -> None:
    """A worker process: load this rank's shard, then obey the broadcast."""
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    # The engine core decides when workers stop; Ctrl-C reaches the whole
    # process group, so it is ignored here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s Worker_TP{rank} %(name)s: %(message)s",
    )
    from pagoda.runtime.sampling_params import InvalidRequestError
    from pagoda.runtime.worker.worker import Worker

    alive = parent_alive(parent_pid)
    reader = None
    worker = None
    try:
        worker = Worker(config, rank, init_method)
        worker.init_device()
        worker.load_model()
        reader = BroadcastReader(handle, rank)
        pipe.send(("ok", None))
        while True:
            message = reader.recv(alive=alive)
            kind = message[0]
            if kind == _STEP:
                _, scheduler_output, last_sampled = message
                if rank != 0 and last_sampled:
                    worker.record_sampled_tokens(last_sampled)
                output = worker.execute_model(scheduler_output)
                if rank == 0:
                    pipe.send(("ok", output))
            elif kind == _RPC:
                _, method, args, kwargs = message
                try:
                    pipe.send(("ok", getattr(worker, method)(*args, **kwargs)))
                except InvalidRequestError as exc:
                    # The caller's mistake (a bad adapter folder): raised
                    # there, and this worker serves on.
                    pipe.send(("raise", exc))
            elif kind == _SHUTDOWN:
                break
    except BroadcastTimeout:
        logger.error("the engine core is gone; exiting")
        os._exit(1)
    except Exception as exc:
        logger.exception("worker %d failed", rank)
        with contextlib.suppress(Exception):
            pipe.send(("error", f"{exc!r}\n{traceback.format_exc(limit=8)}"))
        os._exit(1)
    finally:
        if reader is not None:
            reader.close()
    if worker is not None:
        worker.shutdown()
