"""`pagoda serve --tensor-parallel-size 2`: it serves, and whichever of its
processes is killed (a worker, the engine core, the API server), the rest
follow within seconds: no orphan keeps a GPU (here a CPU) busy."""

import os
import signal
import time

import httpx
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tiny_checkpoint, tmp_path_factory):
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("tiny-tp")
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=2048,
    )
    tiny_checkpoint(folder, config)
    return folder


def start(server_process_cls, tmp_path, model) -> tuple:
    server = server_process_cls(tmp_path, [str(model), "--tensor-parallel-size", "2"]).start()
    procs = server.descendants()
    workers = [p for p in procs if p not in server.children]
    assert len(workers) >= 2, "the engine core should have two worker processes"
    return server, procs


def test_tp2_server_serves_and_stops_cleanly(server_process_cls, tmp_path, tiny_model):
    server, procs = start(server_process_cls, tmp_path, tiny_model)
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    out = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert out["usage"]["completion_tokens"] == 8
    assert server.stop() == 0
    assert not server.wait_gone(procs, 15)
    server.assert_clean()


def test_a_killed_worker_takes_the_server_down_within_seconds(
    server_process_cls, tmp_path, tiny_model
):
    server, procs = start(server_process_cls, tmp_path, tiny_model)
    worker = [p for p in procs if p not in server.children][-1]
    os.kill(worker, signal.SIGKILL)
    started = time.monotonic()
    code = server.wait(timeout=30)
    assert code != 0
    assert time.monotonic() - started < 10, server.log()
    assert "worker" in server.log() and "died" in server.log()
    assert not server.wait_gone(procs, 10)


def test_a_killed_engine_core_takes_its_workers_along(server_process_cls, tmp_path, tiny_model):
    server, procs = start(server_process_cls, tmp_path, tiny_model)
    os.kill(server.core_pid, signal.SIGKILL)
    assert server.wait(timeout=30) != 0
    assert not server.wait_gone(procs, 10)


def test_a_killed_api_server_leaves_no_process(server_process_cls, tmp_path, tiny_model):
    server, procs = start(server_process_cls, tmp_path, tiny_model)
    server.proc.kill()
    server.wait(timeout=10)
    assert not server.wait_gone(procs, 15)
