"""The operator end to end against the kmock Kubernetes emulator.

Each test runs the real `pagoda-operator` coroutine (kopf, cluster-wide,
standalone) in the test's event loop and talks to it only through the API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

NS = "llm"
LLMS_PATH = f"/apis/pagoda.dev/v1alpha1/namespaces/{NS}/llmservices"

DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
CONFIGMAPS = "v1/configmaps"
PDBS = "policy/v1/poddisruptionbudgets"
LLMS = "pagoda.dev/v1alpha1/llmservices"


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll until `check()` returns a truthy value (or stops raising); fail after timeout."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
            error: BaseException | None = None
        except (KeyError, AssertionError, ValueError, IndexError) as e:
            error = e
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met in {timeout}s: {error!r}")
        await asyncio.sleep(0.05)


def llmservice(name: str = "chat", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "LLMService",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "generation": 1,
            # kopf guards its finalizer patches with a resourceVersion test.
            "resourceVersion": "1",
        },
        "spec": {"model": "smollm2-135m-instruct", **spec},
    }


async def create(kmock: Any, body: dict[str, Any]) -> None:
    async with kmock.post(LLMS_PATH, json=body) as response:
        assert response.status < 300, await response.text()


async def patch(kmock: Any, path: str, body: dict[str, Any]) -> None:
    headers = {"Content-Type": "application/merge-patch+json"}
    async with kmock.patch(path, json=body, headers=headers) as response:
        assert response.status < 300, await response.text()


def obj(kmock: Any, resource: str, name: str) -> dict[str, Any]:
    found = kmock.objects[resource, NS, name]
    assert not found.deleted
    return found.raw


def exists(kmock: Any, resource: str, name: str) -> bool:
    try:
        return not kmock.objects[resource, NS, name].deleted
    except KeyError:
        return False


def condition(kmock: Any, name: str, kind: str) -> dict[str, Any]:
    conditions = obj(kmock, LLMS, name).get("status", {}).get("conditions", [])
    for found in conditions:
        if found["type"] == kind:
            return found
    raise KeyError(kind)


def events(kmock: Any, reason: str) -> list[dict[str, Any]]:
    found = []
    for request in list(kmock):
        posted = request.method == "POST" and request.url.path.endswith("/events")
        if posted and isinstance(request.data, dict) and request.data.get("reason") == reason:
            found.append(request.data)
    return found


def writes(kmock: Any, plural: str) -> list[Any]:
    return [
        r
        for r in list(kmock)
        if r.method in ("POST", "PATCH", "PUT", "DELETE") and f"/{plural}" in r.url.path
    ]


async def test_create_renders_children_with_owner_references(operator: Any) -> None:
    await create(operator, llmservice())
    deployment = await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    service = await eventually(lambda: obj(operator, SERVICES, "chat"))
    configmap = await eventually(lambda: obj(operator, CONFIGMAPS, "chat-engine"))
    for child in (deployment, service, configmap):
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner["kind"] == "LLMService" and owner["name"] == "chat"
        assert owner["uid"] == "uid-chat" and owner["controller"] is True
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.test/pagoda-runtime:1"
    assert container["command"] == ["pagoda", "serve"]
    assert container["args"][0] == "smollm2-135m-instruct"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert configmap["data"] == {"PAGODA_DTYPE": "auto"}
    assert container["args"][container["args"].index("--served-model-name") + 1] == "chat"
    assert exists(operator, SERVICES, "chat")
    assert not exists(operator, PDBS, "chat")  # one replica: no budget
    assert await eventually(lambda: events(operator, "Created"))


async def test_status_reports_endpoint_and_conditions(operator: Any) -> None:
    await create(operator, llmservice())
    status = await eventually(lambda: obj(operator, LLMS, "chat")["status"]["conditions"])
    full = obj(operator, LLMS, "chat")["status"]
    assert full["endpoint"] == "http://chat.llm.svc.cluster.local/v1"
    assert full["selector"] == "app.kubernetes.io/name=pagoda-runtime,pagoda.dev/llmservice=chat"
    assert {c["type"] for c in status} == {"Ready", "Progressing", "Degraded"}
    assert condition(operator, "chat", "Ready")["status"] == "False"
    assert condition(operator, "chat", "Degraded")["status"] == "False"


async def test_steady_state_makes_no_writes(operator: Any) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    await eventually(lambda: obj(operator, LLMS, "chat")["status"]["conditions"])
    await asyncio.sleep(1.0)  # let the first passes settle
    before = {p: len(writes(operator, p)) for p in ("deployments", "services", "configmaps")}
    status_writes = len(writes(operator, "llmservices/chat/status"))
    await asyncio.sleep(2.0)  # four resync ticks
    after = {p: len(writes(operator, p)) for p in ("deployments", "services", "configmaps")}
    assert after == before
    assert len(writes(operator, "llmservices/chat/status")) == status_writes


async def test_spec_change_patches_the_deployment_and_nothing_else(operator: Any) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    await eventually(lambda: obj(operator, LLMS, "chat")["status"]["conditions"])
    await asyncio.sleep(0.5)
    service_writes, cm_writes = (
        len(writes(operator, "services")),
        len(writes(operator, "configmaps")),
    )
    await patch(
        operator, f"{LLMS_PATH}/chat", {"spec": {"image": "registry.test/pagoda-runtime:2"}}
    )

    def rolled() -> bool:
        container = obj(operator, DEPLOYMENTS, "chat")["spec"]["template"]["spec"]["containers"][0]
        return container["image"] == "registry.test/pagoda-runtime:2"

    await eventually(rolled)
    await asyncio.sleep(1.0)
    assert len(writes(operator, "services")) == service_writes
    assert len(writes(operator, "configmaps")) == cm_writes
    assert await eventually(lambda: events(operator, "Updated"))


async def test_engine_change_updates_configmap_and_rolls_pods(operator: Any) -> None:
    await create(operator, llmservice())
    first = await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    old_hash = first["spec"]["template"]["metadata"]["annotations"]["pagoda.dev/engine-config-hash"]
    await patch(operator, f"{LLMS_PATH}/chat", {"spec": {"engine": {"maxModelLen": 4096}}})
    await eventually(
        lambda: obj(operator, CONFIGMAPS, "chat-engine")["data"]["PAGODA_MAX_MODEL_LEN"] == "4096"
    )
    annotations = lambda: obj(operator, DEPLOYMENTS, "chat")["spec"]["template"]["metadata"][  # noqa: E731
        "annotations"
    ]
    await eventually(lambda: annotations()["pagoda.dev/engine-config-hash"] != old_hash)


async def test_deleted_child_is_restored(operator: Any) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, SERVICES, "chat"))
    async with operator.delete(f"/api/v1/namespaces/{NS}/services/chat") as response:
        assert response.status == 200
    assert not exists(operator, SERVICES, "chat")
    restored = await eventually(lambda: obj(operator, SERVICES, "chat"))
    assert restored["spec"]["ports"][0]["port"] == 80


async def test_hand_edited_child_is_repaired_with_an_event(operator: Any) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    await patch(
        operator, f"/apis/apps/v1/namespaces/{NS}/deployments/chat", {"spec": {"replicas": 7}}
    )
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat")["spec"]["replicas"] == 1)
    (event,) = await eventually(lambda: events(operator, "DriftRepaired"))
    assert "spec.replicas" in event["message"] and event["type"] == "Warning"


async def test_invalid_spec_is_degraded_with_an_event_and_no_children(operator: Any) -> None:
    # tensorParallelSize 3 cannot split 4 GPUs: the CEL rule would reject it at
    # admission; the emulator does not, so the operator must.
    bad = llmservice("bad", tensorParallelSize=3, resources={"gpus": 4})
    await create(operator, bad)
    await create(operator, llmservice("good"))
    degraded = await eventually(lambda: condition(operator, "bad", "Degraded"))
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "spec.tensorParallelSize" in degraded["message"]
    (event,) = await eventually(lambda: events(operator, "InvalidSpec"))
    assert event["type"] == "Warning" and "spec.tensorParallelSize" in event["message"]
    # Other objects keep being reconciled.
    await eventually(lambda: obj(operator, DEPLOYMENTS, "good"))
    await asyncio.sleep(1.0)
    for resource, name in ((DEPLOYMENTS, "bad"), (SERVICES, "bad"), (CONFIGMAPS, "bad-engine")):
        assert not exists(operator, resource, name)


async def test_missing_secret_blocks_children_until_it_exists(operator: Any) -> None:
    await create(operator, llmservice(apiKeySecretRef={"name": "keys"}))
    degraded = await eventually(lambda: condition(operator, "chat", "Degraded"))
    assert degraded["reason"] == "MissingReference"
    assert "spec.apiKeySecretRef.name" in degraded["message"]
    assert not exists(operator, DEPLOYMENTS, "chat")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keys", "namespace": NS}}
    secret["data"] = {"api-key": "c2VjcmV0"}
    async with operator.post(f"/api/v1/namespaces/{NS}/secrets", json=secret) as response:
        assert response.status < 300
    deployment = await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0]["valueFrom"]["secretKeyRef"] == {"name": "keys", "key": "api-key"}
    await eventually(lambda: condition(operator, "chat", "Degraded")["status"] == "False")


async def test_status_follows_the_deployments_ready_replicas(operator: Any) -> None:
    await create(operator, llmservice(replicas=2))
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    generation = obj(operator, DEPLOYMENTS, "chat")["metadata"]["generation"]
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/chat/status"
    state = {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 1, "availableReplicas": 1}
    state["observedGeneration"] = generation  # as the Deployment controller reports it
    await patch(operator, path, {"status": state})
    await eventually(lambda: obj(operator, LLMS, "chat")["status"]["readyReplicas"] == 1)
    assert condition(operator, "chat", "Ready")["status"] == "False"
    assert condition(operator, "chat", "Progressing")["status"] == "True"
    await patch(operator, path, {"status": {"readyReplicas": 2, "availableReplicas": 2}})
    await eventually(lambda: condition(operator, "chat", "Ready")["status"] == "True")
    assert obj(operator, LLMS, "chat")["status"]["readyReplicas"] == 2
    assert condition(operator, "chat", "Progressing")["reason"] == "RolloutComplete"


async def test_crashlooping_pods_make_the_service_degraded(operator: Any) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "chat-abc",
            "namespace": NS,
            "labels": {"app.kubernetes.io/name": "pagoda-runtime", "pagoda.dev/llmservice": "chat"},
        },
        "status": {
            "containerStatuses": [
                {
                    "name": "runtime",
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                    "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                }
            ]
        },
    }
    async with operator.post(f"/api/v1/namespaces/{NS}/pods", json=pod) as response:
        assert response.status < 300
    degraded = await eventually(
        lambda: (
            condition(operator, "chat", "Degraded")["status"] == "True"
            and condition(operator, "chat", "Degraded")
        )
    )
    assert degraded["reason"] == "CrashLoopBackOff" and "OOMKilled" in degraded["message"]
    assert await eventually(lambda: events(operator, "CrashLoopBackOff"))


async def test_budget_follows_the_replica_count(operator: Any) -> None:
    await create(operator, llmservice(replicas=3))
    pdb = await eventually(lambda: obj(operator, PDBS, "chat"))
    assert pdb["spec"]["maxUnavailable"] == 1
    await patch(operator, f"{LLMS_PATH}/chat", {"spec": {"replicas": 1}})
    await eventually(lambda: not exists(operator, PDBS, "chat"))
    assert obj(operator, DEPLOYMENTS, "chat")["spec"]["replicas"] == 1
    assert await eventually(lambda: events(operator, "Deleted"))


async def test_reconciles_are_counted_in_the_operators_metrics(operator: Any) -> None:
    from pagoda.operator.metrics import REGISTRY

    def count(result: str) -> float:
        return (
            REGISTRY.get_sample_value(
                "pagoda_operator_reconciles_total", {"trigger": "resync", "result": result}
            )
            or 0.0
        )

    before = count("ok")
    await create(operator, llmservice())
    await eventually(lambda: count("ok") > before)
    assert REGISTRY.get_sample_value(
        "pagoda_operator_child_writes_total", {"kind": "Deployment", "action": "create"}
    )


async def test_the_handlers_also_run_under_kopfs_own_cli(cluster: Any) -> None:
    from kopf.testing import KopfRunner

    args = ["run", "--all-namespaces", "--standalone", "-m", "pagoda.operator.main"]
    runner = KopfRunner(args, timeout=20)
    await asyncio.to_thread(runner.__enter__)
    try:
        await create(cluster, llmservice("via-kopf"))
        deployment = await eventually(lambda: obj(cluster, DEPLOYMENTS, "via-kopf"))
        assert deployment["metadata"]["ownerReferences"][0]["name"] == "via-kopf"
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
    assert runner.exit_code == 0, runner.output
