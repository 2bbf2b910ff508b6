"""The one door to the Kubernetes API: real HTTP framing, credentials, errors, threads."""

from __future__ import annotations

import asyncio
import stat
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubesim.apiserver import ApiServer
from kubesim.chunking import ChunkingProxy
from kubesim.operator import write_kubeconfig
from kubesim.testing import (
    DEPLOYMENTS,
    LLMS,
    NS,
    condition,
    create,
    events,
    eventually,
    llmservice,
    obj,
    patch,
    path_of,
    requests_to,
)
from pagoda.operator.api import KubeApi
from pagoda.operator.errors import ApiError


def configmap(name: str = "big", size: int = 8192) -> dict[str, Any]:
    """A ConfigMap whose body is well over the ~2 KiB a real server sends chunked."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": {"team": "ml"}},
        "data": {"blob": "x" * size},
    }


@pytest.fixture()
async def proxy(cluster: ApiServer) -> AsyncIterator[ChunkingProxy]:
    async with ChunkingProxy(str(cluster.url)) as running:
        yield running


@pytest.fixture()
def api_behind_proxy(
    proxy: ChunkingProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> KubeApi:
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "proxied", proxy.url)))
    api = KubeApi.from_environment()
    yield api
    api.close()


@pytest.fixture()
def api(cluster: ApiServer) -> KubeApi:
    client = KubeApi.from_environment()
    yield client
    client.close()


async def test_the_proxy_frames_bodies_like_a_real_api_server(
    cluster: ApiServer, proxy: ChunkingProxy
) -> None:
    await create(cluster, configmap())
    async with (
        aiohttp.ClientSession() as session,
        session.get(proxy.url + path_of("v1/configmaps", NS, "big")) as response,
    ):
        assert "Content-Length" not in response.headers
        assert response.headers["Transfer-Encoding"] == "chunked"
        assert len((await response.json())["data"]["blob"]) == 8192


async def test_chunked_bodies_are_read_whole(cluster: ApiServer, api_behind_proxy: KubeApi) -> None:
    applied = await api_behind_proxy.apply(configmap(), "pagoda-operator")
    assert len(applied["data"]["blob"]) == 8192
    fetched = await api_behind_proxy.get("ConfigMap", NS, "big")
    assert fetched is not None and fetched["metadata"]["resourceVersion"]
    assert fetched["data"] == configmap()["data"]
    (listed,) = await api_behind_proxy.list("ConfigMap", NS, {"team": "ml"})
    assert listed["metadata"]["name"] == "big"


async def test_calls_run_off_the_event_loop(cluster: ApiServer, api: KubeApi) -> None:
    await create(cluster, configmap("slow"))
    cluster.fail("GET", "/configmaps/slow$", None, delay=1.0)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    assert await api.get("ConfigMap", NS, "slow") is not None
    ticker.cancel()
    assert time.monotonic() - started >= 1.0
    assert ticks >= 10  # the loop kept running while the call waited


async def test_a_kubeconfig_exec_plugin_supplies_the_token(
    cluster: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = tmp_path / "credential-plugin"
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import json\n"
        'print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", '
        '"kind": "ExecCredential", "status": {"token": "token-from-exec"}}))\n'
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(plugin),
            "interactiveMode": "Never",
        }
    }
    monkeypatch.setenv(
        "KUBECONFIG", str(write_kubeconfig(tmp_path / "exec", str(cluster.url), user))
    )
    api = KubeApi.from_environment()
    try:
        await api.apply(configmap("via-exec"), "pagoda-operator")
        assert api.connection_info().token == "token-from-exec"  # kopf's login gets it too
    finally:
        api.close()
    (write,) = requests_to(cluster, "PATCH", "/configmaps/via-exec")
    headers = {k.lower(): v for k, v in dict(write.headers).items()}
    assert headers["authorization"] == "Bearer token-from-exec"


async def test_a_missing_object_is_none_and_errors_are_classified(
    cluster: ApiServer, api: KubeApi
) -> None:
    assert await api.get("Deployment", NS, "absent") is None
    cluster.fail("GET", "/deployments/forbidden$", 403, reason="Forbidden", message="no rbac")
    cluster.fail("GET", "/deployments/flaky$", 503, reason="ServiceUnavailable")
    with pytest.raises(ApiError) as forbidden:
        await api.get("Deployment", NS, "forbidden")
    assert forbidden.value.status == 403 and forbidden.value.permanent
    assert "no rbac" in str(forbidden.value) and f"Deployment {NS}/forbidden" in str(
        forbidden.value
    )
    with pytest.raises(ApiError) as flaky:
        await api.get("Deployment", NS, "flaky")
    assert flaky.value.status == 503 and not flaky.value.permanent


async def test_an_unreachable_server_is_a_transient_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "k", "http://127.0.0.1:9")))
    api = KubeApi.from_environment()
    try:
        with pytest.raises(ApiError) as e:
            await api.get("Service", NS, "x")
    finally:
        api.close()
    assert e.value.status is None and not e.value.permanent


async def test_delete_touches_only_the_object_that_was_checked(
    cluster: ApiServer, api: KubeApi
) -> None:
    first = await api.apply(configmap("x", 10), "pagoda-operator")
    with pytest.raises(ApiError) as e:
        await api.delete("ConfigMap", NS, "x", "another-uid", None)
    assert e.value.status == 409
    assert await api.delete("ConfigMap", NS, "x", first["metadata"]["uid"], None)
    assert not await api.delete("ConfigMap", NS, "x", first["metadata"]["uid"], None)


async def test_the_operator_works_behind_chunked_responses(
    cluster: ApiServer,
    proxy: ChunkingProxy,
    run_operator: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every API call of the operator (its client's and kopf's) goes through the proxy.
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "proxied", proxy.url)))
    async with run_operator():
        await create(cluster, llmservice(replicas=1))
        await eventually(lambda: obj(cluster, DEPLOYMENTS, "chat"))
        await asyncio.sleep(1.5)
        # The Deployment was read whole, so an unchanged spec is not "Updated" again.
        assert events(cluster, "Updated") == []
        state = {"replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1}
        await patch(cluster, path_of(DEPLOYMENTS, NS, "chat") + "/status", {"status": state})
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "chat-1",
                "namespace": NS,
                # As the EndpointSlice controller writes them: the Service's labels too.
                "labels": {
                    "app.kubernetes.io/managed-by": "pagoda-operator",
                    "kubernetes.io/service-name": "chat",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}}],
        }
        await create(cluster, slice_)
        # The slice and the Deployment's status reach the operator by separate watches,
        # so the Ready condition may land one sync before the replica count does.
        await eventually(
            lambda: (
                condition(cluster, "chat", "Ready")["status"] == "True"
                and obj(cluster, LLMS, "chat")["status"]["readyReplicas"] == 1
            )
        )
        # Pod lists arrive whole too: a crash loop is seen.
        template = obj(cluster, DEPLOYMENTS, "chat")["spec"]["template"]
        crashing = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "chat-x", "namespace": NS, **template["metadata"]},
            "status": {
                "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]
            },
        }
        await create(cluster, crashing)
        await eventually(
            lambda: condition(cluster, "chat", "Degraded")["reason"] == "CrashLoopBackOff"
        )
        assert events(cluster, "Updated") == []
    assert proxy.chunked_responses > 20


def test_only_the_api_module_talks_to_the_kubernetes_api() -> None:
    # One door: the official client, in operator/api.py; kopf does its own watching.
    package = Path(__file__).resolve().parents[2] / "operator"
    clients = ("kubernetes", "aiohttp", "urllib3", "httpx", "requests", "http.client")
    talking = {
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        for line in path.read_text().splitlines()
        if line.startswith(("import ", "from "))
        and line.split()[1].split(".")[0] in {c.split(".")[0] for c in clients}
    }
    # The other door is to the runtime pods (/metrics, the LoRA API): plain HTTP.
    # liveness.py serves the probe endpoint (a server, no client).
    assert talking == {"api.py", "pod_http.py", "liveness.py"}
    served = (package / "liveness.py").read_text()
    assert "ClientSession" not in served and "import aiohttp.web" in served
    pods = (package / "pod_http.py").read_text()
    assert "import kubernetes" not in pods and "from kubernetes" not in pods


async def test_the_scale_write_holds_only_if_the_count_is_still_the_one_read(
    cluster: ApiServer, api: KubeApi
) -> None:
    await create(cluster, llmservice(replicas=0))
    # 0 is no field in an autoscaling/v1 Scale: tested as an empty spec.
    assert (await api.get_scale(NS, "chat"))["spec"] == {}
    await api.patch_scale(NS, "chat", 2, expected=0)
    assert obj(cluster, LLMS, "chat")["spec"]["replicas"] == 2
    with pytest.raises(ApiError) as stale:
        await api.patch_scale(NS, "chat", 5, expected=1)
    assert stale.value.status == 422
    assert obj(cluster, LLMS, "chat")["spec"]["replicas"] == 2
    await api.patch_scale(NS, "chat", 1, expected=2)
    assert obj(cluster, LLMS, "chat")["spec"]["replicas"] == 1
