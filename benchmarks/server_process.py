"""A server process for the benchmarks: started on a free port, healthy when
the constructor returns, stopped with SIGTERM (SIGKILL for its whole session
if it does not go)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pagoda_serve_cmd(port: int, *flags: str) -> list[str]:
    """`pagoda serve` on 127.0.0.1:`port` with this interpreter."""
    return [sys.executable, "-m", "pagoda.runtime.entrypoints.cli", "serve",
            "--host", "127.0.0.1", "--port", str(port), *flags]  # fmt: skip


class ServerProcess:
    """`cmd` serving on `port`; its output goes to a log file kept until `stop()`."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        port: int,
        env: dict | None = None,
        timeout: float = 300,
    ):
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (kept for the server's life)
            prefix=f"bench-{name}-", suffix=".log", delete=False
        )
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.startup_s = self._wait_healthy(timeout)

    def _wait_healthy(self, timeout: float) -> float:
        while time.monotonic() - self.start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}; {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return time.monotonic() - self.start
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"{self.name} not healthy after {timeout:.0f} s; log {self.log.name}")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, check: bool = False) -> None:
        """SIGTERM and wait; `check`: a non-zero exit status is an error
        (the log is then kept)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.returncode
        if check and rc != 0:
            raise RuntimeError(f"{self.name} exit status {rc}; log {self.log.name}")
        os.unlink(self.log.name)
