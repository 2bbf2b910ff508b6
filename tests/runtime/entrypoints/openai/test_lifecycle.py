"""Process life cycle: refusing to start, SIGTERM draining, and the death of
the EngineCore. Every test checks that no process and no ipc socket is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

BODY = {"prompt": "Once upon a time", "max_tokens": 60, "ignore_eos": True, "stream": True}


def stream_in_background(url: str, body: dict) -> tuple[threading.Thread, dict]:
    """Start a streaming request; the result dict fills in as it runs."""
    result: dict = {"lines": [], "status": None, "error": None}

    def run() -> None:
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as resp:
                result["status"] = resp.status_code
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        result["lines"].append(line[6:])
        except httpx.HTTPError as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_refuses_to_start_when_one_request_cannot_fit(smollm2_available, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pagoda.runtime.entrypoints.cli",
            "serve",
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--kv-cache-memory",
            "0.01",
            "--num-threads",
            "1",
            "--port",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--kv-cache-memory" in proc.stderr and "max_model_len" in proc.stderr
    # No ipc socket or socket folder is left (torch may leave its own caches).
    assert not [p for p in tmp_path.rglob("*") if p.is_socket() or p.name.startswith("pagoda-")]


def test_tensor_parallel_size_that_does_not_divide_the_heads_is_refused_clearly():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pagoda.runtime.entrypoints.cli",
            "serve",
            "--tensor-parallel-size",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    # SmolLM2 has 9 attention heads and 3 KV heads: 2 ranks cannot split them.
    assert "tensor_parallel_size 2 does not divide" in proc.stderr
    assert "9 attention heads" in proc.stderr and "3 key/value heads" in proc.stderr


def test_sigterm_drains_in_flight_requests_then_exits_0(start_server):
    server = start_server(["--drain-timeout", "60"])
    thread, result = stream_in_background(server.url, BODY)
    wait_for(lambda: len(result["lines"]) >= 3)
    server.proc.send_signal(signal.SIGTERM)
    # Draining: new requests and probes get 503 while the stream goes on.
    wait_for(lambda: httpx.get(server.url + "/health").status_code == 503, 10)
    refused = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert thread.is_alive()
    thread.join(120)
    assert result["status"] == 200 and result["error"] is None
    assert result["lines"][-1] == "[DONE]"
    assert '"finish_reason":"length"' in result["lines"][-2]
    assert server.wait(60) == 0, server.log()
    server.assert_clean()
    assert "drained" in server.log()


def test_sigterm_cuts_requests_off_after_the_drain_timeout(start_server):
    server = start_server(["--drain-timeout", "1"])
    body = {**BODY, "max_tokens": 900}
    thread, result = stream_in_background(server.url, body)
    wait_for(lambda: len(result["lines"]) >= 2)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait(60) == 0, server.log()
    assert time.monotonic() - start < 30
    thread.join(30)
    assert "[DONE]" not in result["lines"]
    server.assert_clean()


def test_killing_the_engine_core_fails_requests_and_exits_nonzero(start_server):
    server = start_server()
    assert server.core_pid is not None
    thread, result = stream_in_background(server.url, {**BODY, "max_tokens": 900})
    wait_for(lambda: len(result["lines"]) >= 2)
    os.kill(server.core_pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: _health(server.url) in (503, None), 10)
    assert time.monotonic() - killed < 5
    thread.join(30)
    # The stream ends with an error event instead of hanging.
    assert any('"error"' in line for line in result["lines"]) or result["error"], result
    assert server.wait(30) != 0, server.log()
    server.assert_clean()


def _health(url: str) -> int | None:
    try:
        return httpx.get(url + "/health", timeout=2).status_code
    except httpx.HTTPError:
        return None
