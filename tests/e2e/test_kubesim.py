"""The simulated cluster itself: the behaviour the operator's tests rely on.

The API server's server-side apply, no-op writes and subresources; the
kubelet, controllers and kube-proxy with a toy container (a few lines of
Python that serve /health), so these run in seconds, without a model.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubesim import fields
from kubesim.apiserver import ApiServer
from kubesim.cluster import Cluster
from kubesim.testing import NS, apply, create, obj, patch, path_of

# --- server-side apply (pure)


def pod_template(*env: str) -> dict[str, Any]:
    container = {"name": "app", "image": "img", "env": [{"name": n, "value": "1"} for n in env]}
    return {"spec": {"containers": [container]}}


def test_another_managers_list_entry_survives_a_forced_apply() -> None:
    obj_, owners = fields.apply({}, pod_template("A"), "operator", {}, force=True)
    obj_, owners = fields.apply(obj_, pod_template("EXTRA"), "kubectl", owners, force=True)
    obj_, owners = fields.apply(obj_, pod_template("A"), "operator", owners, force=True)
    assert [e["name"] for e in obj_["spec"]["containers"][0]["env"]] == ["A", "EXTRA"]


def test_a_field_the_manager_stops_applying_is_removed() -> None:
    obj_, owners = fields.apply({}, pod_template("A", "B"), "operator", {}, force=True)
    obj_, owners = fields.apply(obj_, pod_template("A"), "operator", owners, force=True)
    assert [e["name"] for e in obj_["spec"]["containers"][0]["env"]] == ["A"]


def test_an_unforced_apply_conflicts_with_another_managers_value() -> None:
    obj_, owners = fields.apply({}, {"spec": {"replicas": 1}}, "operator", {}, force=True)
    with pytest.raises(fields.ApplyConflict, match=r"spec\.replicas"):
        fields.apply(obj_, {"spec": {"replicas": 2}}, "hpa", owners, force=False)
    same, shared = fields.apply(obj_, {"spec": {"replicas": 1}}, "hpa", owners, force=False)
    assert same == obj_ and set(shared) == {"operator", "hpa"}


# --- the API server


LEASES = "coordination.k8s.io/v1/leases"
CONFIGMAP = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "c", "namespace": NS, "labels": {"team": "ml"}},
    "data": {"a": "1"},
}


async def test_an_apply_that_changes_nothing_is_no_write(cluster_api: ApiServer) -> None:
    first = await apply(cluster_api, CONFIGMAP, "operator")
    again = await apply(cluster_api, CONFIGMAP, "operator")
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    changed = await apply(cluster_api, {**CONFIGMAP, "data": {"a": "2"}}, "operator")
    assert changed["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]


async def test_an_update_of_a_stale_version_is_a_conflict(cluster_api: ApiServer) -> None:
    # Leader election's optimistic concurrency: of two writers that read the
    # same version, only the first one's update is stored.
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l", "namespace": NS},
        "spec": {"holderIdentity": "a"},
    }
    async with cluster_api.post(path_of(LEASES, NS), json=lease) as response:
        read = await response.json()
    path = path_of(LEASES, NS, "l")
    first = {**read, "spec": {"holderIdentity": "b"}}
    second = {**read, "spec": {"holderIdentity": "c"}}
    async with cluster_api.put(path, json=first) as response:
        assert response.status == 200
    async with cluster_api.put(path, json=second) as response:
        assert response.status == 409
        assert (await response.json())["reason"] == "Conflict"
    assert obj(cluster_api, LEASES, "l")["spec"]["holderIdentity"] == "b"


async def test_status_and_scale_are_subresources(cluster_api: ApiServer) -> None:
    body = {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": "x", "namespace": NS},
        "spec": {"model": "m", "replicas": 1},
    }
    await create(cluster_api, body)
    llms = path_of("pagoda.dev/v1alpha1/llmservices", NS, "x")
    await patch(cluster_api, llms, {"status": {"replicas": 5}})  # ignored on the object
    assert "status" not in obj(cluster_api, "pagoda.dev/v1alpha1/llmservices", "x")
    await patch(cluster_api, llms + "/status", {"status": {"replicas": 1}, "spec": {"replicas": 9}})
    stored = obj(cluster_api, "pagoda.dev/v1alpha1/llmservices", "x")
    assert stored["status"] == {"replicas": 1} and stored["spec"]["replicas"] == 1
    scale = await patch(cluster_api, llms + "/scale", {"spec": {"replicas": 3}})
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
    stored = obj(cluster_api, "pagoda.dev/v1alpha1/llmservices", "x")
    assert stored["spec"]["replicas"] == 3 and stored["metadata"]["generation"] == 2


async def test_lists_honour_label_selectors(cluster_api: ApiServer) -> None:
    await create(cluster_api, CONFIGMAP)
    path = path_of("v1/configmaps", NS)
    for selector, count in (("team=ml", 1), ("team=web", 0), ("team in (ml,web)", 1), ("!team", 0)):
        async with cluster_api.get(path, params={"labelSelector": selector}) as response:
            assert len((await response.json())["items"]) == count, selector


# --- the node: a toy container instead of the runtime

TOY = """
import argparse, http.server
p = argparse.ArgumentParser(); p.add_argument("--host"); p.add_argument("--port", type=int)
a = p.parse_args()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"toy")
    def log_message(self, *args): pass
http.server.HTTPServer((a.host, a.port), H).serve_forever()
"""


def toy_deployment(replicas: int = 1) -> dict[str, Any]:
    labels = {"app": "toy"}
    container = {
        "name": "toy",
        "image": "toy",
        "command": [Path(sys.executable).name, "-c", TOY],
        "args": ["--host", "0.0.0.0", "--port", "8000"],
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "toy", "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 2},
            },
        },
    }


TOY_SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "toy", "namespace": NS},
    "spec": {
        "selector": {"app": "toy"},
        "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
    },
}


@pytest.fixture()
async def node(kmock: ApiServer, tmp_path: Path) -> Any:
    async with Cluster(kmock, tmp_path, operator_config=None) as cluster:
        yield cluster


@pytest.fixture()
def cluster_api(kmock: ApiServer) -> ApiServer:
    from kubesim.resources import declare

    declare(kmock)
    return kmock


async def test_each_pod_runs_its_command_on_its_own_address(node: Cluster) -> None:
    await node.create(toy_deployment(replicas=2))
    pods = await node.wait_for(
        lambda: len(node.ready_pods()) == 2 and node.ready_pods(), 30, "2 pods"
    )
    assert len({p.ip for p in pods}) == 2 and all(p.port == 8000 for p in pods)
    assert [httpx.get(p.url, timeout=5).text for p in pods] == ["toy", "toy"]
    status = node.get("Deployment", "toy")["status"]
    await node.wait_for(
        lambda: node.get("Deployment", "toy")["status"]["readyReplicas"] == 2, 10, "status"
    )
    assert status["replicas"] == 2
    stored = node.get("Pod", pods[0].name)
    assert stored["status"]["podIP"] == pods[0].ip and stored["status"]["phase"] == "Running"


async def test_a_killed_container_is_restarted(node: Cluster) -> None:
    await node.create(toy_deployment())
    (pod,) = await node.wait_for(node.ready_pods, 30, "a ready pod")
    killed = node.kill(pod)
    await node.wait_for(
        lambda: pod.restarts == 1 and pod.ready and pod.pid != killed, 30, "restarted"
    )
    statuses = node.get("Pod", pod.name)["status"]["containerStatuses"]
    await asyncio.sleep(0.5)
    assert node.get("Pod", pod.name)["status"]["containerStatuses"][0]["restartCount"] == 1
    assert statuses[0]["lastState"]["terminated"]["exitCode"] == 137


async def test_a_service_reaches_ready_pods_through_its_cluster_ip(node: Cluster) -> None:
    await node.create(TOY_SERVICE)
    await node.create(toy_deployment())
    await node.wait_for(node.ready_pods, 30, "a ready pod")
    url = await node.wait_for(lambda: node.service_url("toy"), 10, "a cluster IP")
    await node.wait_for(
        lambda: node.get("EndpointSlice", "toy-kubesim")["endpoints"][0]["conditions"]["ready"],
        10,
        "a ready endpoint",
    )
    # Asynchronously: the proxy runs in this event loop.
    async with httpx.AsyncClient(timeout=5) as client:
        assert (await client.get(url)).text == "toy"
    assert node.get("Service", "toy")["spec"]["clusterIP"] == url.split("//")[1].split(":")[0]


async def test_owned_objects_are_garbage_collected(node: Cluster) -> None:
    await node.create(toy_deployment())
    (pod,) = await node.wait_for(node.ready_pods, 30, "a ready pod")
    await node.delete("Deployment", "toy")
    await node.wait_for(lambda: not node.objects("Pod") and not node.pods(), 30, "pods gone")
    assert pod.pid is None
    with pytest.raises(httpx.HTTPError):
        httpx.get(pod.url, timeout=2)


SEED = """
import os, pathlib, sys
data = pathlib.Path(os.environ["DATA"])
if not (data / "tried").exists():
    (data / "tried").write_text("1")
    print("first try fails", flush=True)
    sys.exit(1)
(data / "seed").write_text("seeded")
"""
SERVE_SEED = TOY.replace('self.wfile.write(b"toy")', 'self.wfile.write(open(a.file, "rb").read())')
SERVE_SEED = SERVE_SEED.replace(
    'p.add_argument("--port", type=int)',
    'p.add_argument("--port", type=int); p.add_argument("--file")',
)


async def test_init_containers_run_to_completion_first_and_share_an_emptydir(
    node: Cluster,
) -> None:
    body = toy_deployment()
    spec = body["spec"]["template"]["spec"]
    python = Path(sys.executable).name
    mount = [{"name": "data", "mountPath": "/data"}]
    spec["volumes"] = [{"name": "data", "emptyDir": {}}]
    spec["initContainers"] = [
        {
            "name": "seed",
            "image": "toy",
            "command": [python, "-c", SEED],
            "env": [{"name": "DATA", "value": "/data"}],
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": mount,
        }
    ]
    (app,) = spec["containers"]
    app["command"] = [python, "-c", SERVE_SEED]
    app["args"] += ["--file", "/data/seed"]
    app["volumeMounts"] = mount
    await node.create(body)

    (pod,) = await node.wait_for(node.ready_pods, 30, "a ready pod")
    assert httpx.get(pod.url, timeout=5).text == "seeded"
    status = node.get("Pod", pod.name)["status"]
    (seed,) = status["initContainerStatuses"]
    assert seed["state"]["terminated"]["exitCode"] == 0 and seed["restartCount"] == 1
    assert seed["lastState"]["terminated"]["message"] == "first try fails"
    initialized = next(c for c in status["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "True"
