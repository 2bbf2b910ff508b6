"""The operator end to end against the simulated API server.

Each test runs the real `pagoda-operator` coroutine (kopf, cluster-wide,
standalone) and talks to it only through the API. Pods and EndpointSlices are
written by the tests, playing the kubelet and the EndpointSlice controller.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kubesim.apiserver import APPLY, ApiServer
from kubesim.testing import (
    CONFIGMAPS,
    DEPLOYMENTS,
    LLMS,
    NS,
    PDBS,
    SERVICES,
    condition,
    crd_changed,
    create,
    delete,
    events,
    eventually,
    exists,
    llmservice,
    obj,
    patch,
    path_of,
    requests_to,
    spec_open,
    version,
    without_rules,
)

CHILDREN = ((DEPLOYMENTS, "chat"), (SERVICES, "chat"), (CONFIGMAPS, "chat-engine"))
SERVICE_LABELS = {"app.kubernetes.io/managed-by": "pagoda-operator"}


def runtime_pod(server: ApiServer, name: str, service: str = "chat", **status: Any) -> dict:
    """A pod of the current template, as the Deployment controller would create it."""
    template = obj(server, DEPLOYMENTS, service)["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": template["metadata"]["labels"],
            "annotations": template["metadata"]["annotations"],
        },
        "status": status,
    }


def ready_pod(server: ApiServer, name: str) -> dict:
    return runtime_pod(
        server, name, phase="Running", conditions=[{"type": "Ready", "status": "True"}]
    )


def endpoint_slice(service: str, ready: int, not_ready: int = 0) -> dict:
    """An EndpointSlice of the Service, as the EndpointSlice controller writes it."""
    endpoints = [
        {"addresses": [f"10.0.0.{i + 1}"], "conditions": {"ready": i < ready}}
        for i in range(ready + not_ready)
    ]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-abcde",
            "namespace": NS,
            # The EndpointSlice controller copies the Service's labels.
            "labels": {**SERVICE_LABELS, "kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
    }


async def settled(server: ApiServer, name: str = "chat") -> None:
    """Wait until the children exist and the status has been written."""
    await eventually(lambda: obj(server, DEPLOYMENTS, name))
    await eventually(lambda: obj(server, LLMS, name)["status"]["conditions"])
    await asyncio.sleep(0.5)


async def test_create_renders_children_with_owner_references(operator: ApiServer) -> None:
    await create(operator, llmservice())
    deployment = await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    service = await eventually(lambda: obj(operator, SERVICES, "chat"))
    configmap = await eventually(lambda: obj(operator, CONFIGMAPS, "chat-engine"))
    for child in (deployment, service, configmap):
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner["kind"] == "LLMService" and owner["name"] == "chat"
        uid = obj(operator, LLMS, "chat")["metadata"]["uid"]  # the server's, not the client's
        assert owner["uid"] == uid and owner["controller"] is True
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.test/pagoda-runtime:1"
    assert container["command"] == ["pagoda", "serve"]
    assert container["args"][0] == "smollm2-135m-instruct"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert configmap["data"] == {"PAGODA_DTYPE": "auto"}
    assert container["args"][container["args"].index("--served-model-name") + 1] == "chat"
    assert not exists(operator, PDBS, "chat")  # one replica: no budget
    wanted = {"Deployment chat created", "Service chat created", "ConfigMap chat-engine created"}
    await eventually(lambda: {e["message"] for e in events(operator, "Created")} >= wanted)


async def test_children_are_written_by_server_side_apply_as_the_operator(
    operator: ApiServer,
) -> None:
    await create(operator, llmservice())
    await settled(operator)
    for resource, name in CHILDREN:
        owners = operator.owners_of(resource, NS, name)
        assert "pagoda-operator" in owners, owners
        entries = obj(operator, resource, name)["metadata"]["managedFields"]
        assert {"manager": "pagoda-operator", "operation": "Apply"}.items() <= next(
            e for e in entries if e["manager"] == "pagoda-operator"
        ).items()


async def test_status_reports_endpoint_and_conditions(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, LLMS, "chat")["status"]["conditions"])
    status = obj(operator, LLMS, "chat")["status"]
    assert status["endpoint"] == "http://chat.llm.svc.cluster.local/v1"
    assert status["selector"] == "app.kubernetes.io/name=pagoda-runtime,pagoda.dev/llmservice=chat"
    assert {c["type"] for c in status["conditions"]} == {"Ready", "Progressing", "Degraded"}
    assert condition(operator, "chat", "Ready")["reason"] == "EndpointsUnavailable"
    assert condition(operator, "chat", "Degraded")["status"] == "False"


async def test_steady_state_changes_nothing(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await settled(operator)
    before = {(r, n): version(operator, r, n) for r, n in CHILDREN}
    llms_version = version(operator, LLMS, "chat")
    posted = len(events(operator))
    await asyncio.sleep(3.5)  # three resyncs, each applying every child again
    assert {(r, n): version(operator, r, n) for r, n in CHILDREN} == before
    assert version(operator, LLMS, "chat") == llms_version  # no status write
    assert len(events(operator)) == posted
    assert len(requests_to(operator, "PATCH", "/deployments/chat")) >= 3  # it did apply


async def test_spec_change_updates_the_deployment_and_nothing_else(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await settled(operator)
    service, configmap = (
        version(operator, SERVICES, "chat"),
        version(operator, CONFIGMAPS, "chat-engine"),
    )
    await patch(
        operator,
        path_of(LLMS, NS, "chat"),
        {"spec": {"image": "registry.test/pagoda-runtime:2"}},
    )

    def rolled() -> bool:
        container = obj(operator, DEPLOYMENTS, "chat")["spec"]["template"]["spec"]["containers"][0]
        return container["image"] == "registry.test/pagoda-runtime:2"

    await eventually(rolled)
    await asyncio.sleep(1.0)
    assert version(operator, SERVICES, "chat") == service
    assert version(operator, CONFIGMAPS, "chat-engine") == configmap
    (updated,) = await eventually(lambda: events(operator, "Updated"))
    assert updated["message"] == "Deployment chat updated to the new spec"


async def test_engine_change_updates_configmap_and_rolls_pods(operator: ApiServer) -> None:
    await create(operator, llmservice())
    first = await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    old_hash = first["spec"]["template"]["metadata"]["annotations"]["pagoda.dev/engine-config-hash"]
    await patch(operator, path_of(LLMS, NS, "chat"), {"spec": {"engine": {"maxModelLen": 4096}}})
    await eventually(
        lambda: obj(operator, CONFIGMAPS, "chat-engine")["data"]["PAGODA_MAX_MODEL_LEN"] == "4096"
    )

    def annotations() -> dict[str, str]:
        return obj(operator, DEPLOYMENTS, "chat")["spec"]["template"]["metadata"]["annotations"]

    await eventually(lambda: annotations()["pagoda.dev/engine-config-hash"] != old_hash)


async def test_deleted_child_is_restored(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, SERVICES, "chat"))
    await delete(operator, SERVICES, "chat")
    assert not exists(operator, SERVICES, "chat")
    restored = await eventually(lambda: obj(operator, SERVICES, "chat"))
    assert restored["spec"]["ports"][0]["port"] == 80


async def test_hand_edited_child_is_repaired_with_an_event(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await settled(operator)
    await patch(
        operator,
        path_of(DEPLOYMENTS, NS, "chat"),
        {"spec": {"replicas": 7}},
        fieldManager="kubectl-edit",
    )
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat")["spec"]["replicas"] == 1)
    (event,) = await eventually(lambda: events(operator, "DriftRepaired"))
    assert event["type"] == "Warning" and "spec.replicas" in event["message"]


async def test_invalid_spec_is_degraded_with_an_event_and_no_children(operator: ApiServer) -> None:
    # Four GPUs for one rank: the CEL rule rejects it at admission, but an object
    # stored before the rule existed is still there, so the operator checks too.
    with crd_changed(operator, without_rules):
        await create(operator, llmservice("bad", resources={"gpus": 4}))
    await create(operator, llmservice("good"))
    degraded = await eventually(lambda: condition(operator, "bad", "Degraded"))
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "spec.resources.gpus" in degraded["message"]
    (event,) = await eventually(lambda: events(operator, "InvalidSpec"))
    assert event["type"] == "Warning" and "spec.resources.gpus" in event["message"]
    # Other objects keep being reconciled.
    await eventually(lambda: obj(operator, DEPLOYMENTS, "good"))
    await asyncio.sleep(1.0)
    for resource, name in ((DEPLOYMENTS, "bad"), (SERVICES, "bad"), (CONFIGMAPS, "bad-engine")):
        assert not exists(operator, resource, name)


async def test_a_tensor_parallel_spec_rolls_out_ranks_gpus_and_shared_memory(
    operator: ApiServer,
) -> None:
    await create(operator, llmservice("tp", tensorParallelSize=2, resources={"gpus": 2}))
    deployment = await eventually(lambda: obj(operator, DEPLOYMENTS, "tp"))
    pod = deployment["spec"]["template"]["spec"]
    (runtime,) = pod["containers"]
    assert runtime["args"][runtime["args"].index("--tensor-parallel-size") + 1] == "2"
    assert runtime["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert {"name": "dshm", "mountPath": "/dev/shm"} in runtime["volumeMounts"]
    degraded = await eventually(lambda: condition(operator, "tp", "Degraded"))
    assert degraded["status"] == "False"


async def test_missing_secret_blocks_children_until_it_exists(operator: ApiServer) -> None:
    await create(operator, llmservice(apiKeySecretRef={"name": "keys"}))
    degraded = await eventually(lambda: condition(operator, "chat", "Degraded"))
    assert degraded["reason"] == "MissingReference"
    assert "spec.apiKeySecretRef.name" in degraded["message"]
    assert not exists(operator, DEPLOYMENTS, "chat")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keys", "namespace": NS}}
    await create(operator, {**secret, "data": {"api-key": "c2VjcmV0"}})
    deployment = await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0]["valueFrom"]["secretKeyRef"] == {"name": "keys", "key": "api-key"}
    await eventually(lambda: condition(operator, "chat", "Degraded")["status"] == "False")


async def test_ready_follows_the_services_serving_endpoints(operator: ApiServer) -> None:
    await create(operator, llmservice(replicas=2))
    await settled(operator)
    assert condition(operator, "chat", "Ready")["status"] == "False"
    await create(operator, endpoint_slice("chat", ready=0, not_ready=2))
    await asyncio.sleep(0.5)
    assert condition(operator, "chat", "Ready")["reason"] == "EndpointsUnavailable"
    await patch(
        operator,
        path_of("discovery.k8s.io/v1/endpointslices", NS, "chat-abcde"),
        {"endpoints": endpoint_slice("chat", ready=1, not_ready=1)["endpoints"]},
    )
    ready = await eventually(lambda: condition(operator, "chat", "Ready")["status"] == "True")
    assert ready
    assert condition(operator, "chat", "Ready")["reason"] == "Serving"


async def test_an_edit_that_cannot_apply_is_degraded_while_the_pods_keep_serving(
    operator: ApiServer,
) -> None:
    await create(operator, llmservice())
    await settled(operator)
    await create(operator, endpoint_slice("chat", ready=1))
    await eventually(lambda: condition(operator, "chat", "Ready")["status"] == "True")
    # A key from a Secret nobody created yet: the pods of the old spec still answer.
    await patch(operator, path_of(LLMS, NS, "chat"), {"spec": {"apiKeySecretRef": {"name": "k"}}})
    await eventually(lambda: condition(operator, "chat", "Degraded")["status"] == "True")
    assert condition(operator, "chat", "Degraded")["reason"] == "MissingReference"
    ready = condition(operator, "chat", "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Serving"), ready
    assert "spec.apiKeySecretRef.name" in ready["message"]


async def test_a_read_write_once_model_claim_with_replicas_is_degraded(
    operator: ApiServer,
) -> None:
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    await create(operator, claim)
    await create(operator, llmservice(model="pvc://models/llama", replicas=2))
    degraded = await eventually(
        lambda: (
            condition(operator, "chat", "Degraded")["status"] == "True"
            and condition(operator, "chat", "Degraded")
        )
    )
    assert degraded["reason"] == "SingleNodeVolume" and "Multi-Attach" in degraded["message"]
    # The rollout goes on: on one node the pods share the volume.
    assert obj(operator, DEPLOYMENTS, "chat")["spec"]["replicas"] == 2
    await patch(operator, path_of(LLMS, NS, "chat") + "/scale", {"spec": {"replicas": 1}})
    await eventually(lambda: condition(operator, "chat", "Degraded")["status"] == "False")


async def test_status_writes_keep_other_writers_conditions(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await settled(operator)
    # Another controller (a policy engine, a GitOps tool) adds a condition of its own.
    theirs = {
        "type": "PolicyCompliant",
        "status": "True",
        "reason": "Checked",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    await patch(
        operator,
        path_of(LLMS, NS, "chat") + "/status",
        {
            "apiVersion": "pagoda.dev/v1alpha1",
            "kind": "LLMService",
            "metadata": {"name": "chat", "namespace": NS},
            "status": {"conditions": [theirs]},
        },
        APPLY,
        fieldManager="policy-controller",
        force="true",
    )
    # The operator's next status write: Ready turns True.
    await create(operator, endpoint_slice("chat", ready=1))
    await eventually(lambda: condition(operator, "chat", "Ready")["status"] == "True")
    kinds = {c["type"] for c in obj(operator, LLMS, "chat")["status"]["conditions"]}
    assert {"Ready", "Progressing", "Degraded", "PolicyCompliant"} <= kinds, kinds


async def test_status_counts_come_from_the_deployment(operator: ApiServer) -> None:
    await create(operator, llmservice(replicas=2))
    await settled(operator)
    state = {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 1, "availableReplicas": 1}
    await patch(operator, path_of(DEPLOYMENTS, NS, "chat") + "/status", {"status": state})
    await eventually(lambda: obj(operator, LLMS, "chat")["status"]["readyReplicas"] == 1)
    assert obj(operator, LLMS, "chat")["status"]["replicas"] == 2


async def test_crashlooping_pods_make_the_service_degraded(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await settled(operator)
    status = {
        "containerStatuses": [
            {
                "name": "runtime",
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
            }
        ]
    }
    await create(operator, runtime_pod(operator, "chat-abc", **status))
    degraded = await eventually(
        lambda: (
            condition(operator, "chat", "Degraded")["status"] == "True"
            and condition(operator, "chat", "Degraded")
        )
    )
    assert degraded["reason"] == "CrashLoopBackOff" and "OOMKilled" in degraded["message"]
    assert await eventually(lambda: events(operator, "CrashLoopBackOff"))


async def test_budget_follows_the_replica_count(operator: ApiServer) -> None:
    await create(operator, llmservice(replicas=3))
    pdb = await eventually(lambda: obj(operator, PDBS, "chat"))
    assert pdb["spec"]["maxUnavailable"] == 1
    await patch(operator, path_of(LLMS, NS, "chat"), {"spec": {"replicas": 1}})
    await eventually(lambda: not exists(operator, PDBS, "chat"))
    assert obj(operator, DEPLOYMENTS, "chat")["spec"]["replicas"] == 1
    (deleted,) = await eventually(lambda: events(operator, "Deleted"))
    assert deleted["message"] == "PodDisruptionBudget chat deleted: no longer needed"


async def test_scale_subresource_scales_the_deployment(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await settled(operator)
    await patch(operator, path_of(LLMS, NS, "chat") + "/scale", {"spec": {"replicas": 3}})
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat")["spec"]["replicas"] == 3)
    assert await eventually(lambda: exists(operator, PDBS, "chat"))


async def test_reconciles_are_counted_in_the_operators_metrics(operator: ApiServer) -> None:
    from pagoda.operator.metrics import REGISTRY

    def count(trigger: str) -> float:
        labels = {"trigger": trigger, "result": "ok"}
        return REGISTRY.get_sample_value("pagoda_operator_reconciles_total", labels) or 0.0

    before = count("start"), count("resync")
    await create(operator, llmservice())
    await eventually(lambda: count("start") > before[0])
    await eventually(lambda: count("resync") > before[1], timeout=5)
    assert REGISTRY.get_sample_value(
        "pagoda_operator_child_writes_total", {"kind": "Deployment", "action": "create"}
    )


async def test_the_handlers_also_run_under_kopfs_own_cli(cluster: ApiServer) -> None:
    from kopf.testing import KopfRunner

    args = ["run", "--all-namespaces", "--standalone", "-m", "pagoda.operator.main"]
    runner = KopfRunner(args, timeout=30)
    await asyncio.to_thread(runner.__enter__)
    try:
        await create(cluster, llmservice("via-kopf"))
        deployment = await eventually(lambda: obj(cluster, DEPLOYMENTS, "via-kopf"))
        assert deployment["metadata"]["ownerReferences"][0]["name"] == "via-kopf"
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
    assert runner.exit_code == 0, runner.output


async def test_fields_of_a_newer_crd_are_ignored_with_a_log_line(
    operator: ApiServer, caplog: Any
) -> None:
    caplog.set_level("WARNING")
    with crd_changed(operator, spec_open):  # the cluster runs a newer CRD than this operator's
        await create(operator, llmservice(guardrails=[{"name": "pii"}], futureKnob=3))
        await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
        await eventually(lambda: condition(operator, "chat", "Degraded")["status"] == "False")
        await eventually(lambda: "spec.guardrails, spec.futureKnob" in caplog.text)
    assert "ignoring fields this operator does not know" in caplog.text


async def test_scaling_out_keeps_ready_and_posts_no_warning(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await settled(operator)
    await create(operator, ready_pod(operator, "chat-a"))
    await create(operator, endpoint_slice("chat", ready=1))
    await eventually(lambda: condition(operator, "chat", "Ready")["status"] == "True")
    since = condition(operator, "chat", "Ready")["lastTransitionTime"]
    await patch(operator, path_of(LLMS, NS, "chat") + "/scale", {"spec": {"replicas": 3}})
    deployment = await eventually(
        lambda: (
            obj(operator, DEPLOYMENTS, "chat")["spec"]["replicas"] == 3
            and obj(operator, DEPLOYMENTS, "chat")
        )
    )
    # The Deployment controller sees the new generation (two pods are loading).
    seen = {"observedGeneration": deployment["metadata"]["generation"], "replicas": 3}
    await patch(operator, path_of(DEPLOYMENTS, NS, "chat") + "/status", {"status": seen})
    await eventually(lambda: condition(operator, "chat", "Progressing")["reason"] == "ScalingUp")
    progressing = condition(operator, "chat", "Progressing")
    assert progressing["message"] == "1 of 3 pods new and ready"
    await asyncio.sleep(1.0)
    ready = condition(operator, "chat", "Ready")
    assert ready["status"] == "True" and ready["lastTransitionTime"] == since
    assert [e for e in events(operator) if e["type"] == "Warning"] == []


async def test_clusters_before_1_30_get_an_exec_sleep_pre_stop(
    cluster: ApiServer, run_operator: Any
) -> None:
    cluster.server_version = (1, 29)
    async with run_operator():
        await create(cluster, llmservice())
        deployment = await eventually(lambda: obj(cluster, DEPLOYMENTS, "chat"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "5"]}}


async def test_clusters_since_1_30_get_the_native_sleep_action(operator: ApiServer) -> None:
    await create(operator, llmservice())
    deployment = await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["lifecycle"]["preStop"] == {"sleep": {"seconds": 5}}
