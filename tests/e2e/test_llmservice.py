"""An LLMService end to end: the operator's pods are real `pagoda serve` processes.

The cluster is kubesim (tests/e2e/kubesim): the API server emulator, the
Deployment and EndpointSlice controllers, the garbage collector, a kubelet
that runs each pod's rendered command on its own loopback address, and a
kube-proxy. The runtime serves the built-in SmolLM2 on the CPU.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from kubesim.cluster import Cluster
from kubesim.kubelet import PodProcess

from .conftest import STARTUP_TIMEOUT, ask_a_pagoda, light_cpu_demo

pytestmark = pytest.mark.usefixtures("smollm2_available")

NAME = "smollm2"  # examples/cpu-demo.yaml


def health(pod: PodProcess) -> int:
    return httpx.get(pod.url + "/health", timeout=5).status_code


async def serving(cluster: Cluster, replicas: int = 1) -> list[PodProcess]:
    """Create the demo and wait until `replicas` runtimes serve behind a Ready LLMService."""
    await cluster.create(light_cpu_demo())
    await cluster.wait_for(lambda: cluster.is_ready(NAME), STARTUP_TIMEOUT, "Ready")
    return cluster.ready_pods(NAME)


async def test_the_cpu_demo_becomes_ready_and_answers_through_its_service(
    cluster: Cluster,
) -> None:
    (pod,) = await serving(cluster)
    # Ready follows the EndpointSlices; readyReplicas the Deployment's status,
    # which its controller may write a moment later.
    await cluster.wait_for(
        lambda: cluster.get("LLMService", NAME)["status"].get("readyReplicas") == 1,
        30,
        "readyReplicas 1",
    )
    status = cluster.get("LLMService", NAME)["status"]
    assert status["endpoint"] == "http://smollm2.llm.svc.cluster.local/v1"
    # The rendered command ran as is, on the pod's own address, with its engine settings.
    assert pod.container["command"] == ["pagoda", "serve"]
    assert pod.ip.startswith("127.") and pod.ip != "127.0.0.1"
    client = openai.AsyncOpenAI(base_url=cluster.service_url(NAME) + "/v1", api_key="unused")
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == [NAME]  # servedModelName defaults to the name
    finally:
        await client.close()
    await ask_a_pagoda(cluster.service_url(NAME), NAME)


async def test_scaling_through_the_scale_subresource_runs_two_runtimes(cluster: Cluster) -> None:
    (first,) = await serving(cluster)
    await cluster.scale(NAME, 2)
    pods = await cluster.wait_for(
        lambda: len(cluster.ready_pods(NAME)) == 2 and cluster.ready_pods(NAME),
        STARTUP_TIMEOUT,
        "two ready runtimes",
    )
    assert first.name in {p.name for p in pods}
    assert len({p.ip for p in pods}) == 2 and len({p.pid for p in pods}) == 2
    assert [health(p) for p in pods] == [200, 200]
    await cluster.wait_for(
        lambda: cluster.get("LLMService", NAME)["status"]["readyReplicas"] == 2,
        30,
        "readyReplicas 2 in the status",
    )
    assert cluster.is_ready(NAME)
    assert cluster.get("PodDisruptionBudget", NAME) is not None  # more than one replica


async def test_a_killed_runtime_is_restarted_and_ready_again(cluster: Cluster) -> None:
    (pod,) = await serving(cluster)
    killed = cluster.kill(pod)
    await cluster.wait_for(lambda: not cluster.is_ready(NAME), 30, "not Ready after the kill")
    assert pod.restarts == 1 or pod.pid != killed
    await cluster.wait_for(
        lambda: pod.ready and cluster.is_ready(NAME), STARTUP_TIMEOUT, "Ready again"
    )
    assert pod.restarts == 1 and pod.pid != killed
    assert health(pod) == 200
    (restarted,) = cluster.ready_pods(NAME)
    assert restarted.name == pod.name  # the same pod, its container restarted
    statuses = cluster.get("Pod", pod.name)["status"]["containerStatuses"]
    assert statuses[0]["restartCount"] == 1
    assert statuses[0]["lastState"]["terminated"]["exitCode"] == 137


async def test_deleting_the_llmservice_removes_its_children_and_processes(
    cluster: Cluster,
) -> None:
    (pod,) = await serving(cluster)
    pids = [pod.pid]
    await cluster.delete("LLMService", NAME)

    def all_gone() -> bool:
        children: list[Any] = [
            cluster.get(kind, name)
            for kind, name in (
                ("LLMService", NAME),
                ("Deployment", NAME),
                ("Service", NAME),
                ("ConfigMap", f"{NAME}-engine"),
            )
        ]
        return all(c is None for c in children) and not cluster.objects("Pod")

    await cluster.wait_for(all_gone, 60, "the LLMService, its children and pods deleted")
    await cluster.wait_for(lambda: not cluster.pods(), 30, "no pod left on the node")
    assert pod.pid is None and all(not _alive(pid) for pid in pids if pid)
    with pytest.raises(httpx.HTTPError):
        httpx.get(pod.url + "/health", timeout=2)


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
