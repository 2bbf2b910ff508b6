"""The Pagoda operator, run against a (simulated) cluster from a test."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from pagoda.operator.cli import Options, serve
from pagoda.operator.config import OperatorConfig

STANDALONE = Options(standalone=True, liveness=None, metrics_port=None)


def write_kubeconfig(path: Path, server: str, user: dict[str, Any] | None = None) -> Path:
    """A kubeconfig for `server`; `user` defaults to a static token."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubesim", "cluster": {"server": server.rstrip("/")}}],
        "users": [{"name": "test", "user": user or {"token": "test-token"}}],
        "contexts": [{"name": "kubesim", "context": {"cluster": "kubesim", "user": "test"}}],
        "current-context": "kubesim",
    }
    path.write_text(yaml.safe_dump(config))
    return path


class OperatorThread:
    """`pagoda-operator`'s coroutine in its own thread and event loop.

    Its own loop because kopf, when it stops, cancels every task it did not
    start in its loop (pytest's fixtures included). The API server keeps
    serving from the test's loop; tests await while the operator works. The
    operator finds the API through $KUBECONFIG, as in a real deployment.

    With leader election (options not standalone), a replica that stands by
    is not ready: start it with `wait_ready=False` and poll `is_ready`.
    """

    def __init__(
        self,
        config: OperatorConfig,
        options: Options = STANDALONE,
        memo: dict[str, Any] | None = None,
        wait_ready: bool = True,
    ) -> None:
        self.config = config
        self.options = options
        self.memo = memo
        self.wait_ready = wait_ready
        # What the operator's coroutine raised, if it ended with an error.
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self, coroutine: Any) -> None:
        try:
            asyncio.run(coroutine)
        except BaseException as e:  # kept for the test, and logged as the thread would
            self.error = e
            logging.getLogger("kubesim").error("the operator ended with an error", exc_info=e)

    @property
    def is_ready(self) -> bool:
        """Whether kopf runs (with leader election: this replica leads)."""
        return self._ready.is_set()

    @property
    def is_alive(self) -> bool:
        """Whether the operator's thread still runs."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Ask the operator to stop (as SIGTERM would); `__aexit__` waits for it."""
        self._stop.set()

    async def __aenter__(self) -> OperatorThread:
        coroutine = serve(
            self.options,
            config=self.config,
            stop_flag=self._stop,
            ready_flag=self._ready,
            memo=self.memo,
        )
        self._thread = threading.Thread(target=self._run, args=(coroutine,), name="operator")
        self._thread.start()
        if self.wait_ready and not await asyncio.to_thread(self._ready.wait, 20):
            self._stop.set()
            raise AssertionError("the operator did not start within 20 s")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        assert self._thread is not None
        await asyncio.to_thread(self._thread.join, 30)
        assert not self._thread.is_alive(), "the operator did not stop within 30 s"
