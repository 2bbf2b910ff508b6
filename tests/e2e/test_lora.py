"""LoRA adapters end to end: the operator keeps every real `pagoda serve` pod in sync.

Adapters are random PEFT folders for SmolLM2 written into the test's folder
(absolute paths: the kubelet runs pods on this host's filesystem). The
adapters file is a real ConfigMap volume, projected and refreshed by the
kubelet like a real one. Which of the two paths (the operator's calls, the
pod's file poll) gets an adapter in first is a race; the Events of each are
tested in tests/operator/test_adapters.py.
"""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubesim.cluster import Cluster
from kubesim.kubelet import PodProcess
from kubesim.testing import NS, events
from pagoda.operator.render.labels import ADMIN_PORT

from .conftest import STARTUP_TIMEOUT, light_cpu_demo

pytestmark = pytest.mark.usefixtures("smollm2_available")

NAME = "smollm2"
# Reaching every pod takes the adapter loop one pass once they are Ready.
CONVERGE_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from pagoda.runtime.lora.random_adapter import write_random_adapter
    from pagoda.runtime.model_loader.builtin import resolve_builtin
    from pagoda.runtime.model_loader.gguf_loader import read_gguf_config

    arch = read_gguf_config(resolve_builtin("smollm2-135m-instruct"))
    root = tmp_path_factory.mktemp("adapters")
    return {n: write_random_adapter(root / n, arch, rank=8, seed=i) for i, n in enumerate("ab")}


def with_lora(replicas: int, adapters: list[dict[str, str]]) -> dict[str, Any]:
    body = light_cpu_demo()
    body["spec"]["replicas"] = replicas
    body["spec"]["lora"] = {"maxLoras": 1, "maxLoraRank": 8}
    body["spec"]["adapters"] = adapters
    return body


def served(pod: PodProcess) -> set[str] | None:
    """The adapters a pod lists in /v1/models; None while it does not answer
    (a pod too busy to answer in time has not said that an adapter is gone)."""
    try:
        listed = httpx.get(pod.url + "/v1/models", timeout=5).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    return {m["id"] for m in listed if m.get("parent")}


def complete(pod: PodProcess, model: str) -> httpx.Response:
    body = {"model": model, "prompt": "Hello", "max_tokens": 2}
    return httpx.post(pod.url + "/v1/completions", json=body, timeout=60)


def adapters_condition(cluster: Cluster) -> dict[str, Any]:
    return cluster.condition(NAME, "AdaptersReady") or {}


async def ready_pods(cluster: Cluster, n: int) -> list[PodProcess]:
    await cluster.wait_for(
        lambda: cluster.is_ready(NAME) and len(cluster.ready_pods(NAME)) == n,
        STARTUP_TIMEOUT,
        f"{n} ready pods",
    )
    return cluster.ready_pods(NAME)


async def test_an_adapter_added_then_removed_reaches_both_pods_without_a_restart(
    cluster: Cluster, adapter_dirs: dict[str, Path]
) -> None:
    await cluster.create(with_lora(2, []))
    pods = await ready_pods(cluster, 2)
    pids = {p.name: p.pid for p in pods}
    template = cluster.get("Deployment", NAME)["spec"]["template"]

    started = time.monotonic()
    await cluster.patch(
        "LLMService",
        NAME,
        {"spec": {"adapters": [{"name": "sql", "source": str(adapter_dirs["a"])}]}},
    )
    await cluster.wait_for(
        lambda: all("sql" in (served(p) or ()) for p in pods), CONVERGE_TIMEOUT, "sql on both pods"
    )
    loaded_after = time.monotonic() - started
    assert [complete(p, "sql").status_code for p in pods] == [200, 200]
    await cluster.wait_for(
        lambda: adapters_condition(cluster).get("message") == "1 adapters on 2 ready pods",
        CONVERGE_TIMEOUT,
        "AdaptersReady for sql",
    )
    status = cluster.get("LLMService", NAME)["status"]
    assert status["adapters"] == [{"name": "sql", "readyPods": 2, "failedPods": 0, "message": ""}]
    assert adapters_condition(cluster)["status"] == "True"
    # The file reached the pods too (the ConfigMap volume), for restarts to come.
    assert "sql" in cluster.get("ConfigMap", f"{NAME}-adapters")["data"]["adapters.json"]

    await cluster.patch("LLMService", NAME, {"spec": {"adapters": []}})
    await cluster.wait_for(
        lambda: all(served(p) == set() for p in pods), CONVERGE_TIMEOUT, "sql gone from both pods"
    )
    assert [complete(p, "sql").status_code for p in pods] == [404, 404]
    assert [complete(p, NAME).status_code for p in pods] == [200, 200]
    await cluster.wait_for(
        lambda: cluster.get("LLMService", NAME)["status"].get("adapters") == [],
        CONVERGE_TIMEOUT,
        "status.adapters emptied",
    )
    # No pod was restarted or replaced, and the template never changed.
    assert {p.name: p.pid for p in cluster.ready_pods(NAME)} == pids
    assert all(p.restarts == 0 for p in pods)
    assert cluster.get("Deployment", NAME)["spec"]["template"] == template
    assert loaded_after < CONVERGE_TIMEOUT


async def test_a_restarted_pod_serves_its_adapters_before_it_is_ready(
    cluster: Cluster, adapter_dirs: dict[str, Path]
) -> None:
    await cluster.create(with_lora(1, [{"name": "sql", "source": str(adapter_dirs["a"])}]))
    (pod,) = await ready_pods(cluster, 1)
    await cluster.wait_for(
        lambda: adapters_condition(cluster).get("status") == "True",
        CONVERGE_TIMEOUT,
        "AdaptersReady",
    )
    await asyncio.sleep(1)  # kopf posts Events from a queue of its own: let it drain first
    loads_before = len(events(cluster.api, "AdapterLoaded"))
    cluster.kill(pod)
    await cluster.wait_for(lambda: not pod.ready, 30, "the pod not ready after the kill")

    # The first answer the new process gives already lists the adapter: it
    # read the adapters file (the ConfigMap volume) before opening its port.
    def first_answer() -> set[str] | None:
        try:
            response = httpx.get(pod.url + "/v1/models", timeout=2)
        except httpx.HTTPError:
            return None
        return {m["id"] for m in response.json()["data"] if m.get("parent")}

    first = await cluster.wait_for(first_answer, STARTUP_TIMEOUT, "the restarted runtime answers")
    assert first == {"sql"}
    await cluster.wait_for(lambda: pod.ready and cluster.is_ready(NAME), STARTUP_TIMEOUT, "Ready")
    assert pod.restarts == 1
    assert complete(pod, "sql").status_code == 200
    # The operator had nothing to load into the new process.
    assert len(events(cluster.api, "AdapterLoaded")) == loads_before


async def test_a_bad_source_fails_the_condition_with_the_runtimes_words(
    cluster: Cluster, adapter_dirs: dict[str, Path], tmp_path: Path
) -> None:
    empty = tmp_path / "not-an-adapter"
    empty.mkdir()
    await cluster.create(
        with_lora(
            1,
            [
                {"name": "good", "source": str(adapter_dirs["b"])},
                {"name": "broken", "source": str(empty)},
            ],
        )
    )
    (pod,) = await ready_pods(cluster, 1)
    await cluster.wait_for(
        lambda: adapters_condition(cluster).get("reason") == "AdapterFailed",
        CONVERGE_TIMEOUT,
        "AdapterFailed",
    )
    condition = adapters_condition(cluster)
    assert condition["status"] == "False"
    assert "broken" in condition["message"] and "adapter_config.json" in condition["message"]
    (failed,) = await cluster.wait_for_events("AdapterFailed")
    assert failed["type"] == "Warning" and "adapter_config.json" in failed["message"]
    entries = {e["name"]: e for e in cluster.get("LLMService", NAME)["status"]["adapters"]}
    assert entries["good"]["readyPods"] == 1 and entries["good"]["failedPods"] == 0
    assert entries["broken"]["failedPods"] == 1 and entries["broken"]["readyPods"] == 0
    # The rest serves on: the good adapter, the base model, readiness.
    assert complete(pod, "good").status_code == 200
    assert complete(pod, NAME).status_code == 200
    assert cluster.is_ready(NAME)


async def test_with_an_api_key_the_operator_converges_through_the_admin_port(
    cluster: Cluster, adapter_dirs: dict[str, Path]
) -> None:
    # The users' key guards the public port; the operator holds a key of its
    # own for the admin port, which the Service does not expose.
    user = {"Authorization": "Bearer users-key"}
    await cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "keys", "namespace": NS},
            "data": {"api-key": base64.b64encode(b"users-key").decode()},
        }
    )
    body = with_lora(1, [])
    body["spec"]["apiKeySecretRef"] = {"name": "keys"}
    await cluster.create(body)
    (pod,) = await ready_pods(cluster, 1)
    admin = f"http://{pod.ip}:{ADMIN_PORT}"
    await cluster.patch(
        "LLMService",
        NAME,
        {"spec": {"adapters": [{"name": "sql", "source": str(adapter_dirs["a"])}]}},
    )
    # The condition was True already with no adapter: wait for the one added.
    await cluster.wait_for(
        lambda: (
            adapters_condition(cluster).get("status") == "True"
            and (cluster.get("LLMService", NAME)["status"].get("adapters") or [{}])[0].get("name")
            == "sql"
        ),
        CONVERGE_TIMEOUT,
        "AdaptersReady with apiKeySecretRef",
    )
    assert cluster.get("LLMService", NAME)["status"]["adapters"] == [
        {"name": "sql", "readyPods": 1, "failedPods": 0, "message": ""}
    ]
    listed = httpx.get(pod.url + "/v1/models", headers=user, timeout=10).json()["data"]
    assert "sql" in {m["id"] for m in listed}
    assert events(cluster.api, "AdminKeyRejected") == []
    # A user of the Service can neither load nor unload; the admin port wants its own key.
    unload = {"lora_name": "sql"}
    public = httpx.post(pod.url + "/v1/unload_lora_adapter", json=unload, headers=user)
    assert public.status_code == 404, public.text
    for headers in ({}, user):
        refused = httpx.post(admin + "/v1/unload_lora_adapter", json=unload, headers=headers)
        assert refused.status_code == 401, refused.text
    service_ports = cluster.get("Service", NAME)["spec"]["ports"]
    assert [p["targetPort"] for p in service_ports] == ["http"]
