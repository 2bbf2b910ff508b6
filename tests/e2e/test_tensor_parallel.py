"""A tensor-parallel LLMService end to end: one pod, three ranks of the built-in model.

SmolLM2-135M has 9 attention heads and 3 KV heads, so three ranks split it
evenly. On a CPU pod the ranks are processes of the one container that
communicate over gloo and receive each step through a shared-memory ring;
the operator renders `--tensor-parallel-size 3` and the /dev/shm volume, and
the kubelet runs exactly that command.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubesim.cluster import Cluster
from kubesim.kubelet import PodProcess

from .conftest import ask_a_pagoda, light_cpu_demo

pytestmark = [pytest.mark.usefixtures("smollm2_available"), pytest.mark.slow]

NAME = "smollm2"
# Three ranks each load the model and join a process group on a shared
# two-core machine: ~40-60 s when idle, more under a parallel test run.
TP_STARTUP_TIMEOUT = 360.0


def _stat(pid: int) -> tuple[int, int]:
    """(parent pid, process group) of a process, from /proc."""
    # After the command name: state, ppid, pgrp.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[2])


def _spawned(pid: int) -> bool:
    """Whether a process is a multiprocessing child (the engine core, a worker)."""
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    return b"spawn_main" in cmdline and b"resource_tracker" not in cmdline


def rank_processes(pod: PodProcess) -> list[int]:
    """The container's tensor-parallel workers: the engine core's spawned children.

    The kubelet starts each container in its own process group; inside it the
    API server (the container's main process) spawns the engine core, which
    spawns one worker per rank.
    """
    tree: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent, group = _stat(int(entry.name))
                if group == pod.pid and _spawned(int(entry.name)):
                    tree[int(entry.name)] = parent
            except OSError:
                continue  # exited meanwhile
    (core,) = [pid for pid, parent in tree.items() if parent == pod.pid]
    return sorted(pid for pid, parent in tree.items() if parent == core)


async def test_a_tensor_parallel_cpu_pod_runs_three_ranks_and_answers(cluster: Cluster) -> None:
    body = light_cpu_demo()
    body["spec"]["tensorParallelSize"] = 3
    await cluster.create(body)
    await cluster.wait_for(lambda: cluster.is_ready(NAME), TP_STARTUP_TIMEOUT, "Ready with TP=3")
    (pod,) = cluster.ready_pods(NAME)

    # The pod spec carries the three ranks and their shared memory...
    args = pod.container["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "3"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod.container["volumeMounts"]
    assert "nvidia.com/gpu" not in pod.container["resources"]["requests"]
    # ...and the container really runs them: the engine core and one worker per rank.
    assert "Started 3 tensor-parallel workers" in pod.log(200_000)
    assert len(rank_processes(pod)) == 3

    await ask_a_pagoda(cluster.service_url(NAME), NAME)


async def test_a_size_the_heads_do_not_divide_is_degraded_with_the_runtimes_reason(
    cluster: Cluster,
) -> None:
    body = light_cpu_demo()
    body["spec"]["tensorParallelSize"] = 2  # 9 heads: the runtime refuses it at start
    await cluster.create(body)

    def degraded() -> dict | None:
        found = cluster.condition(NAME, "Degraded")
        return found if found and found["status"] == "True" else None

    found = await cluster.wait_for(degraded, 120, "Degraded by the refused size")
    assert found["reason"] == "CrashLoopBackOff"
    assert "exit: Error (code 2)" in found["message"]
    assert "tensor_parallel_size 2" in found["message"]
    assert "9 attention heads" in found["message"]
    assert not cluster.is_ready(NAME)
