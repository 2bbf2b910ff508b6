"""kubesim's workloads behave as a real cluster's: Deployments, ReplicaSets, pod deletion.

The decisions (`rollout`, `graceful`) are tested as pure functions; the
controllers and the kubelet with a toy container (a few lines of Python that
serve HTTP), so each test runs in seconds, without a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubesim import graceful, rollout
from kubesim.apiserver import ApiServer
from kubesim.cluster import Cluster
from kubesim.pods import active, controller_uid, deletion_rank, pod_ready
from kubesim.testing import NS, PODS, path_of, requests_to

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)

# --- rollout arithmetic (pure)


def deployment(replicas: int = 10, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": NS, "uid": "d-uid", "generation": 1},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": []}},
            **spec,
        },
    }


def replica_set(
    name: str, size: int, available: int = 0, created: str = "", **annotations: str
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": created or f"2026-01-01T00:00:0{len(name) % 10}Z",
            "annotations": dict(annotations),
            "generation": 1,
        },
        "spec": {"replicas": size, "template": {}},
        "status": {"replicas": size, "availableReplicas": available, "observedGeneration": 1},
    }


def rolling(surge: int | str, unavailable: int | str) -> dict[str, Any]:
    return {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable},
    }


def test_percentages_round_surge_up_and_unavailable_down() -> None:
    assert rollout.fenceposts(deployment(10)) == (3, 2)  # the 25% defaults
    assert rollout.fenceposts(deployment(3, strategy=rolling("25%", "50%"))) == (1, 1)
    # 10% of 3: surge rounds 0.3 up to 1, unavailable down to 0.
    assert rollout.fenceposts(deployment(3, strategy=rolling("10%", "10%"))) == (1, 0)
    # Both 0 would never move: one pod may then be unavailable.
    assert rollout.fenceposts(deployment(3, strategy=rolling(0, "10%"))) == (0, 1)


def test_the_new_replica_set_grows_within_the_surge() -> None:
    spec = deployment(4, strategy=rolling(1, 0))
    old = replica_set("d-old", 4, available=4)
    new = rollout.new_replica_set(spec, [old])
    assert new["spec"]["replicas"] == 1
    labels = new["spec"]["template"]["metadata"]["labels"]
    assert new["metadata"]["name"] == f"d-{labels['pod-template-hash']}"
    assert (
        new["spec"]["selector"]["matchLabels"]["pod-template-hash"] == labels["pod-template-hash"]
    )
    assert new["metadata"]["ownerReferences"][0]["uid"] == "d-uid"
    assert new["metadata"]["annotations"] == {
        rollout.REVISION: "1",
        rollout.DESIRED_REPLICAS: "4",
        rollout.MAX_REPLICAS: "5",
    }
    assert rollout.reconcile_new(spec, [old, new], new) is None  # 5 pods: the surge is spent


def test_old_replica_sets_shrink_unavailable_pods_first_then_keep_the_minimum() -> None:
    spec = deployment(4, strategy=rolling(1, 1))
    older = replica_set("d-a", 2, available=0, created="2026-01-01T00:00:00Z")
    newer_old = replica_set("d-b", 2, available=2, created="2026-01-01T00:00:01Z")
    new = replica_set("d-c", 1, available=1, created="2026-01-01T00:00:02Z")
    # 5 pods, 3 available, at least 3 must stay: only the 2 unavailable ones go.
    assert rollout.old_scale_down(spec, [older, newer_old], new) == {"d-a": 0}
    healthy = replica_set("d-a", 3, available=3, created="2026-01-01T00:00:00Z")
    assert rollout.old_scale_down(spec, [healthy], new) == {"d-a": 2}


def test_a_scale_mid_rollout_is_shared_in_proportion() -> None:
    # The example of the Kubernetes documentation: 10 replicas, maxSurge 3, a
    # rollout stuck at 8 old and 5 new pods, scaled to 15: 3 more old, 2 more new.
    spec = deployment(15, strategy=rolling(3, 2))
    stamped = {rollout.DESIRED_REPLICAS: "10", rollout.MAX_REPLICAS: "13"}
    old = replica_set("d-old", 8, available=8, created="2026-01-01T00:00:00Z", **stamped)
    new = replica_set("d-new", 5, available=0, created="2026-01-01T00:00:01Z", **stamped)
    assert rollout.is_scaling_event(spec, new, [old])
    assert rollout.proportional_scale(spec, new, [old]) == {"d-old": 11, "d-new": 7}


def test_revision_history_limit_keeps_the_newest_settled_old_replica_sets() -> None:
    spec = deployment(1, revisionHistoryLimit=1)
    old = [
        replica_set(f"d-{n}", 0, created=f"2026-01-01T00:00:0{n}Z", **{rollout.REVISION: str(n)})
        for n in (1, 2, 3)
    ]
    assert rollout.cleanup(spec, old) == ["d-1", "d-2"]
    old[0]["spec"]["replicas"] = 1  # still scaling down: kept
    assert rollout.cleanup(spec, old) == ["d-2"]


def test_progress_stalls_into_progress_deadline_exceeded() -> None:
    spec = deployment(1, progressDeadlineSeconds=60)
    new = replica_set("d-new", 1, available=0)
    spec["status"] = {
        "replicas": 1,
        "updatedReplicas": 1,
        "conditions": [
            rollout.condition("Progressing", True, rollout.RS_UPDATED, "", NOW),
        ],
    }
    soon = rollout.rollout_status(spec, [new], new, NOW + datetime.timedelta(seconds=30))
    assert rollout.get_condition(soon, "Progressing")["reason"] == rollout.RS_UPDATED
    late = rollout.rollout_status(spec, [new], new, NOW + datetime.timedelta(seconds=61))
    stuck = rollout.get_condition(late, "Progressing")
    assert (stuck["status"], stuck["reason"]) == ("False", "ProgressDeadlineExceeded")
    available = rollout.get_condition(late, "Available")
    assert (available["status"], available["reason"]) == ("False", "MinimumReplicasUnavailable")


def ranked_pod(name: str, ready: bool, created: str, ready_since: str = "") -> dict[str, Any]:
    condition = {"type": "Ready", "status": str(ready), "lastTransitionTime": ready_since}
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"nodeName": "kubesim-node"},
        "status": {"phase": "Running", "conditions": [condition]},
    }


def test_a_replica_set_deletes_unready_then_recently_ready_pods_first() -> None:
    pods = [
        ranked_pod("old-ready", True, "2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z"),
        ranked_pod("new-ready", True, "2026-01-01T00:00:05Z", "2026-01-01T00:00:20Z"),
        ranked_pod("not-ready", False, "2026-01-01T00:00:01Z"),
    ]
    order = [p["metadata"]["name"] for p in sorted(pods, key=deletion_rank)]
    assert order == ["not-ready", "new-ready", "old-ready"]


# --- graceful deletion (pure)


def pod(grace: int | None = 5, node: str | None = "kubesim-node") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": []}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": "p", "uid": "u"}, "spec": spec, "status": {"phase": "Running"}}


def test_a_deleted_pod_is_marked_with_its_grace_period() -> None:
    deletion = graceful.delete_pod(pod(grace=5), None, NOW)
    meta = deletion.obj["metadata"]
    assert not deletion.remove and deletion.changed
    assert meta["deletionGracePeriodSeconds"] == 5
    assert meta["deletionTimestamp"] == "2026-01-01T00:00:05Z"
    assert (
        graceful.delete_pod(pod(grace=None), None, NOW).obj["metadata"][
            "deletionGracePeriodSeconds"
        ]
        == 30
    )
    # DeleteOptions win over the pod's own period.
    assert (
        graceful.delete_pod(pod(grace=5), 2, NOW).obj["metadata"]["deletionGracePeriodSeconds"] == 2
    )


def test_a_pod_no_kubelet_runs_goes_at_once() -> None:
    assert graceful.delete_pod(pod(node=None), None, NOW).remove
    stopped = pod()
    stopped["status"]["phase"] = "Succeeded"
    assert graceful.delete_pod(stopped, None, NOW).remove


def test_a_later_delete_may_only_shorten_the_grace_period() -> None:
    marked = graceful.delete_pod(pod(grace=30), None, NOW).obj
    assert not graceful.delete_pod(marked, None, NOW).changed
    assert not graceful.delete_pod(marked, 60, NOW).changed
    shorter = graceful.delete_pod(marked, 10, NOW + datetime.timedelta(seconds=3))
    assert shorter.changed and not shorter.remove
    # Counted from the first DELETE, not the second.
    assert shorter.obj["metadata"]["deletionTimestamp"] == "2026-01-01T00:00:10Z"
    assert graceful.delete_pod(marked, 0, NOW).remove  # the kubelet's final DELETE


def test_delete_options_come_from_the_body_or_the_query() -> None:
    assert graceful.requested_grace({}, {"gracePeriodSeconds": 0}) == 0
    assert graceful.requested_grace({"gracePeriodSeconds": "3"}, None) == 3
    assert graceful.requested_grace({}, {}) is None


# --- the cluster, with a toy container

TOY = """
import argparse, http.server, signal, sys
p = argparse.ArgumentParser(); p.add_argument("--host"); p.add_argument("--port", type=int)
p.add_argument("--ignore-sigterm", action="store_true")
a = p.parse_args()
def bye(*_):
    print("got SIGTERM", flush=True); sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if a.ignore_sigterm else bye)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"toy")
    def log_message(self, *args): pass
http.server.HTTPServer((a.host, a.port), H).serve_forever()
"""


def toy(replicas: int = 1, *args: str, grace: int = 2, **spec: Any) -> dict[str, Any]:
    labels = {"app": "toy"}
    container = {
        "name": "toy",
        "image": "toy",
        "command": [Path(sys.executable).name, "-c", TOY],
        "args": ["--host", "0.0.0.0", "--port", "8000", *args],
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
                "spec": {"containers": [container], "terminationGracePeriodSeconds": grace},
            },
            **spec,
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
async def node(kmock: ApiServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster(kmock, tmp_path, operator_config=None, tick=0.1, probe_interval=0.2) as c:
        yield c


def condition(cluster: Cluster, kind: str) -> tuple[str, str]:
    found = rollout.get_condition(cluster.get("Deployment", "toy")["status"], kind)
    assert found is not None, kind
    return found["status"], found["reason"]


def complete(cluster: Cluster) -> bool:
    """The rollout is done, by `kubectl rollout status`'s test."""
    deployment = cluster.get("Deployment", "toy") or {}
    status = deployment.get("status") or {}
    wanted = (deployment.get("spec") or {}).get("replicas", 1)
    return (
        status.get("observedGeneration") == deployment.get("metadata", {}).get("generation")
        and status.get("updatedReplicas", 0) == wanted
        and status.get("replicas", 0) == wanted
        and status.get("availableReplicas", 0) == wanted
        and condition(cluster, "Progressing") == ("True", "NewReplicaSetAvailable")
    )


def with_env(body: dict[str, Any], value: str) -> dict[str, Any]:
    """A template change: the rollout of a new revision."""
    return {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            **body["spec"]["template"]["spec"]["containers"][0],
                            "env": [{"name": "V", "value": value}],
                        }
                    ]
                }
            }
        }
    }


async def test_a_deployment_runs_its_pods_through_a_replica_set(node: Cluster) -> None:
    created = await node.create(toy(replicas=2))
    await node.wait_for(lambda: complete(node), 30, "the rollout complete")
    (rs,) = node.objects("ReplicaSet")
    pod_hash = rs["metadata"]["labels"]["pod-template-hash"]
    assert rs["metadata"]["name"] == f"toy-{pod_hash}"
    assert controller_uid(rs) == created["metadata"]["uid"]
    assert rs["metadata"]["annotations"][rollout.REVISION] == "1"
    assert node.get("Deployment", "toy")["metadata"]["annotations"][rollout.REVISION] == "1"
    pods = node.objects("Pod")
    assert len(pods) == 2
    for found in pods:
        (ref,) = found["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "ReplicaSet",
            rs["metadata"]["name"],
            rs["metadata"]["uid"],
            True,
        )
        assert found["metadata"]["labels"] == {"app": "toy", "pod-template-hash": pod_hash}
        assert found["metadata"]["name"].startswith(rs["metadata"]["name"] + "-")
    status = node.get("Deployment", "toy")["status"]
    assert {k: v for k, v in status.items() if k != "conditions"} == {
        "observedGeneration": 1,
        "replicas": 2,
        "updatedReplicas": 2,
        "readyReplicas": 2,
        "availableReplicas": 2,
    }
    assert condition(node, "Available") == ("True", "MinimumReplicasAvailable")
    assert rs["status"]["replicas"] == 2 and rs["status"]["availableReplicas"] == 2


async def test_a_scale_resizes_the_replica_set_without_a_new_revision(node: Cluster) -> None:
    await node.create(toy(1))
    await node.wait_for(lambda: complete(node), 30, "the rollout complete")
    await node.patch("Deployment", "toy", {"spec": {"replicas": 3}})
    await node.wait_for(
        lambda: node.get("Deployment", "toy")["status"].get("availableReplicas") == 3,
        30,
        "3 available replicas",
    )
    (rs,) = node.objects("ReplicaSet")
    assert rs["spec"]["replicas"] == 3
    assert rs["metadata"]["annotations"][rollout.DESIRED_REPLICAS] == "3"
    assert rs["metadata"]["annotations"][rollout.REVISION] == "1"
    assert condition(node, "Progressing") == ("True", "NewReplicaSetAvailable")


@contextlib.asynccontextmanager
async def pod_census(server: ApiServer, wanted: int) -> AsyncIterator[dict[str, int]]:
    """Watch the pods; on every event note the most active pods and, once `wanted` of them
    were ready, the fewest ready active ones."""
    seen: dict[str, int] = {"most": 0, "fewest_ready": 1 << 30}
    armed = False
    pods: dict[str, dict[str, Any]] = {}

    async def watch() -> None:
        nonlocal armed
        async with server.get(path_of(PODS, NS), params={"watch": "true"}) as response:
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                name = event["object"]["metadata"]["name"]
                if event["type"] == "DELETED":
                    pods.pop(name, None)
                else:
                    pods[name] = event["object"]
                running = [p for p in pods.values() if active(p)]
                seen["most"] = max(seen["most"], len(running))
                ready = sum(1 for p in running if pod_ready(p))
                armed = armed or ready >= wanted
                if armed:
                    seen["fewest_ready"] = min(seen["fewest_ready"], ready)

    task = asyncio.create_task(watch())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_rolling_update_honours_max_surge_and_max_unavailable(node: Cluster) -> None:
    body = toy(4, strategy=rolling(1, 0))
    await node.create(body)
    await node.wait_for(lambda: complete(node), 30, "the first rollout complete")
    first = node.objects("ReplicaSet")[0]["metadata"]["name"]
    async with pod_census(node.api, wanted=4) as seen:
        await node.patch("Deployment", "toy", with_env(body, "2"))
        await node.wait_for(
            lambda: len(node.objects("ReplicaSet")) == 2 and complete(node), 60, "the rollout"
        )
    sets = {rs["metadata"]["name"]: rs for rs in node.objects("ReplicaSet")}
    (second,) = set(sets) - {first}
    assert sets[first]["spec"]["replicas"] == 0 and sets[second]["spec"]["replicas"] == 4
    assert sets[second]["metadata"]["annotations"][rollout.REVISION] == "2"
    # Never more than replicas + maxSurge pods, never fewer than replicas - maxUnavailable ready.
    assert seen["most"] == 5 and seen["fewest_ready"] == 4
    status = node.get("Deployment", "toy")["status"]
    assert status["observedGeneration"] == 2 and status["updatedReplicas"] == 4


async def test_revision_history_limit_prunes_old_replica_sets(node: Cluster) -> None:
    body = toy(1, revisionHistoryLimit=1)
    await node.create(body)
    await node.wait_for(lambda: complete(node), 30, "revision 1 rolled out")
    for value in ("2", "3"):
        await node.patch("Deployment", "toy", with_env(body, value))
        await node.wait_for(
            lambda v=value: (
                node.get("Deployment", "toy")["metadata"]["annotations"][rollout.REVISION] == v
                and complete(node)
                and len(node.objects("ReplicaSet")) == 2
            ),
            60,
            f"revision {value} rolled out and pruned",
        )
    by_revision = {
        rollout.revision(rs): rs["metadata"]["name"] for rs in node.objects("ReplicaSet")
    }
    assert sorted(by_revision) == [2, 3]
    # Back to revision 2's template: its ReplicaSet is the new one again, as revision 4.
    await node.patch("Deployment", "toy", with_env(body, "2"))
    await node.wait_for(
        lambda: (
            {rollout.revision(rs): rs["metadata"]["name"] for rs in node.objects("ReplicaSet")}
            == {3: by_revision[3], 4: by_revision[2]}
        ),
        60,
        "the revision-2 ReplicaSet reused as revision 4",
    )


async def test_availability_waits_for_min_ready_seconds(node: Cluster) -> None:
    await node.create(toy(1, minReadySeconds=3600, progressDeadlineSeconds=3600))
    await node.wait_for(
        lambda: node.get("Deployment", "toy")["status"].get("readyReplicas") == 1, 30, "ready"
    )
    status = node.get("Deployment", "toy")["status"]
    assert "availableReplicas" not in status and status["unavailableReplicas"] == 1
    assert condition(node, "Available") == ("False", "MinimumReplicasUnavailable")
    assert condition(node, "Progressing")[1] in ("NewReplicaSetCreated", "ReplicaSetUpdated")
    await node.patch("Deployment", "toy", {"spec": {"minReadySeconds": 0}})
    await node.wait_for(lambda: complete(node), 30, "available without minReadySeconds")
    assert node.objects("ReplicaSet")[0]["spec"]["minReadySeconds"] == 0


async def test_a_rollout_without_progress_exceeds_its_deadline(node: Cluster) -> None:
    body = toy(1, progressDeadlineSeconds=1)
    # Nothing listens on port 8001: the pod never turns ready.
    body["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = {
        "httpGet": {"path": "/", "port": 8001}
    }
    await node.create(body)
    await node.wait_for(
        lambda: condition(node, "Progressing") == ("False", "ProgressDeadlineExceeded"),
        30,
        "the deadline exceeded",
    )
    assert condition(node, "Available") == ("False", "MinimumReplicasUnavailable")
    message = rollout.get_condition(node.get("Deployment", "toy")["status"], "Progressing")
    assert message["message"].endswith("has timed out progressing.")


def endpoint(cluster: Cluster, pod_name: str) -> dict[str, Any] | None:
    endpoints = cluster.get("EndpointSlice", "toy-kubesim")["endpoints"]
    return next((e for e in endpoints if e["targetRef"]["name"] == pod_name), None)


async def test_a_deleted_pod_drains_as_a_terminating_endpoint(node: Cluster) -> None:
    body = toy(1, grace=30)
    # A 3 s preStop pause: the pod still serves while it is a terminating endpoint.
    body["spec"]["template"]["spec"]["containers"][0]["lifecycle"] = {
        "preStop": {"sleep": {"seconds": 3}}
    }
    await node.create(TOY_SERVICE)
    await node.create(body)
    (handle,) = await node.wait_for(node.ready_pods, 30, "a ready pod")
    await node.wait_for(lambda: endpoint(node, handle.name)["conditions"]["ready"], 10, "ready")
    await node.delete("Pod", handle.name)
    stored = node.get("Pod", handle.name)
    assert stored["metadata"]["deletionGracePeriodSeconds"] == 30
    assert stored["metadata"]["deletionTimestamp"]
    await node.wait_for(
        lambda: (
            endpoint(node, handle.name)["conditions"]
            == {"ready": False, "serving": True, "terminating": True}
        ),
        10,
        "a terminating endpoint",
    )
    # The ReplicaSet does not count a terminating pod: its replacement starts now.
    await node.wait_for(
        lambda: [p for p in node.objects("Pod") if p["metadata"]["name"] != handle.name],
        10,
        "a replacement",
    )
    # After the pause, SIGTERM: the toy exits at once, long before the 30 s grace period.
    await node.wait_for(lambda: node.get("Pod", handle.name) is None, 20, "the pod removed")
    await node.wait_for(lambda: endpoint(node, handle.name) is None, 10, "the endpoint removed")
    assert "got SIGTERM" in handle.log()


async def test_a_pod_that_ignores_sigterm_is_killed_at_its_deadline(node: Cluster) -> None:
    await node.create(toy(1, "--ignore-sigterm", grace=3))
    (handle,) = await node.wait_for(node.ready_pods, 30, "a ready pod")
    path = path_of(PODS, NS, handle.name)
    async with node.api.delete(path, json={"gracePeriodSeconds": 30}) as response:
        assert (await response.json())["metadata"]["deletionGracePeriodSeconds"] == 30
    # A second DELETE shortens the grace period, as `kubectl delete --grace-period=1` does.
    async with node.api.delete(
        path_of(PODS, NS, handle.name), json={"gracePeriodSeconds": 1}
    ) as response:
        assert response.status == 200
        assert (await response.json())["metadata"]["deletionGracePeriodSeconds"] == 1
    await node.wait_for(lambda: node.get("Pod", handle.name) is None, 20, "the pod removed")
    final = requests_to(node.api, "PATCH", f"/pods/{handle.name}/status")[-1].data["status"]
    (container,) = final["containerStatuses"]
    assert container["state"]["terminated"]["exitCode"] == 137
    assert final["phase"] == "Failed"


async def test_deleting_a_deployment_collects_replica_sets_then_pods(node: Cluster) -> None:
    await node.create(toy(2))
    await node.wait_for(lambda: len(node.ready_pods()) == 2, 30, "2 ready pods")
    await node.delete("Deployment", "toy")
    await node.wait_for(
        lambda: not node.objects("ReplicaSet") and not node.objects("Pod") and not node.pods(),
        30,
        "everything gone",
    )
