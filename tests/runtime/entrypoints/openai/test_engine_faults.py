"""The EngineCore never fails silently: a malformed frame, an exception in
either IO thread, a step that never returns, or a frozen process each end in
a dead engine that the front end knows about within seconds (FAILED or a
missed heartbeat), and a core process that is gone.

The first four drive the real EngineCoreClient and core process (SmolLM2),
with the fault injected inside the spawned child; the last freezes the core
of a live `pagoda serve` and watches /health and the exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.core.core_proc import run_engine_core
from pagoda.runtime.core.outputs import EngineCoreRequest
from pagoda.runtime.core.wire import ADD
from pagoda.runtime.engine.core_client import EngineCoreClient, EngineDeadError
from pagoda.runtime.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
import _pagoda_core_faults as faults  # (found through the path above)

pytestmark = [pytest.mark.model, pytest.mark.slow]

ARGS = EngineArgs(
    model="smollm2-135m-instruct", dtype="float32", max_model_len=1024, kv_cache_memory_gib=0.25
)


def a_request(request_id: str = "r1") -> EngineCoreRequest:
    return EngineCoreRequest(request_id, [1, 2, 3, 4], SamplingParams(max_tokens=50))


@contextlib.asynccontextmanager
async def core(target=run_engine_core, **kwargs):
    client = EngineCoreClient(
        ARGS.create_engine_config(), num_threads=1, process_target=target, **kwargs
    )
    try:
        await asyncio.wait_for(client.wait_ready(), 240)
        yield client
    finally:
        client.shutdown(timeout=2)


async def death_reason(client: EngineCoreClient, timeout: float = 30.0) -> str:
    """Read outputs until the client reports the core dead; the reason."""
    deadline = time.monotonic() + timeout
    # Outputs may come first; the loop ends with the error.
    with pytest.raises(EngineDeadError) as dead:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "the engine core was not reported dead in time"
            await asyncio.wait_for(client.get_output(), left)
    return str(dead.value)


def exit_status(client: EngineCoreClient, timeout: float = 15.0) -> int | None:
    client.process.wait(timeout)
    return client.process.exitcode


async def test_a_malformed_frame_fails_the_engine_loudly():
    async with core() as client:
        await client.input_socket.send_multipart([ADD, b"\xc1 not msgpack"])
        reason = await death_reason(client)
        assert "input thread failed" in reason
        assert exit_status(client) == 1


async def test_an_exception_in_the_input_thread_fails_the_engine_loudly():
    async with core(faults.input_thread_raises) as client:
        await client.add_request(a_request())
        reason = await death_reason(client)
        assert "injected fault in the input thread" in reason
        assert exit_status(client) == 1


async def test_an_exception_in_the_output_thread_fails_the_engine_loudly():
    async with core(faults.output_thread_raises) as client:
        await client.add_request(a_request())
        # The socket still works: the output thread says why before the end.
        reason = await death_reason(client)
        assert "injected fault in the output thread" in reason
        assert exit_status(client) not in (None, 0)


async def test_a_step_that_never_returns_is_noticed_and_the_core_killed():
    async with core(faults.step_hangs, step_timeout=3.0) as client:
        await client.add_request(a_request())
        start = time.monotonic()
        reason = await death_reason(client, 30)
        assert "stuck" in reason
        assert time.monotonic() - start < 20
        assert exit_status(client) not in (None, 0)  # killed, not left hanging


def test_a_frozen_core_turns_health_503_and_the_server_exits_nonzero(start_server):
    server = start_server(["--engine-heartbeat-timeout", "2"])
    assert server.core_pid is not None
    try:
        os.kill(server.core_pid, signal.SIGSTOP)  # alive, silent, never stepping
        frozen = time.monotonic()
        deadline = frozen + 20
        while _health(server.url) == 200:
            assert time.monotonic() < deadline, "/health still 200 for a frozen core"
            time.sleep(0.2)
        assert time.monotonic() - frozen < 15
        assert server.wait(30) != 0, server.log()
        assert "hung" in server.log()
        server.assert_clean()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.core_pid, signal.SIGKILL)


def _health(url: str) -> int | None:
    try:
        return httpx.get(url + "/health", timeout=2).status_code
    except httpx.HTTPError:
        return None
