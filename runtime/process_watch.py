"""One thread per child process owns its exit: it waits for the process,
reaps it, keeps the exit code, and tells whoever asked.

Why not `Process.join()` / `is_alive()` / `exitcode` from wherever they are
needed: each of those calls `waitpid` on the child, and when two threads do
so at once (a watcher that saw the process die, and a shutdown joining it),
the one that loses the race gets ECHILD, which multiprocessing reports as
"still running". A shutdown then waits for a process that is gone, and its
SIGKILL aims at a pid the kernel may already have handed to someone else.
Here exactly one thread waits on the child; everyone else reads an Event.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess

logger = logging.getLogger(__name__)

# The sentinel closes while the child exits, a moment before it can be
# reaped; and another reaper (multiprocessing's own clean-up when any new
# Process starts) may win the waitpid, setting the code a moment later.
_EXIT_CODE_GRACE_S = 1.0


class ProcessWatch:
    """Watches one started `multiprocessing` process until it exits.

    `on_exit(exitcode)` runs in the watch thread once the process is gone
    (exitcode is None only if its status was lost to another reaper).
    """

    def __init__(self, proc: BaseProcess, on_exit: Callable[[int | None], None] | None = None):
        self.proc = proc
        self.pid = proc.pid
        self.exitcode: int | None = None
        self._on_exit = on_exit
        self._exited = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{proc.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        multiprocessing.connection.wait([self.proc.sentinel])
        self.proc.join()  # the sentinel is ready: a blocking waitpid, brief
        deadline = time.monotonic() + _EXIT_CODE_GRACE_S
        while self.proc.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        self.exitcode = self.proc.exitcode
        self._exited.set()
        if self._on_exit is not None:
            self._on_exit(self.exitcode)

    @property
    def alive(self) -> bool:
        return not self._exited.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the process has exited (and been reaped)."""
        return self._exited.wait(timeout)

    def send_signal(self, sig: int) -> None:
        """Signal the process unless it is already gone."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def stop(self, timeout: float) -> int | None:
        """Wait `timeout` for the process to leave (the caller has asked it
        to), then SIGTERM and wait again, then SIGKILL. The exit code."""
        if not self.wait(timeout):
            logger.warning(
                "%s (pid %d) did not stop in %.0f s; sending SIGTERM",
                self.proc.name,
                self.pid,
                timeout,
            )
            self.send_signal(signal.SIGTERM)
            if not self.wait(timeout):
                logger.warning(
                    "%s (pid %d) ignored SIGTERM; sending SIGKILL", self.proc.name, self.pid
                )
                self.kill()
                self.wait()
        return self.exitcode
