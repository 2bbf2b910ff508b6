"""Watch events of the owned kinds wake the owner's loop; the resync is only a safety net."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from kubesim.apiserver import ApiServer
from kubesim.testing import (
    DEPLOYMENTS,
    NS,
    SERVICES,
    condition,
    create,
    delete,
    eventually,
    llmservice,
    obj,
    patch,
    path_of,
)
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import parse
from pagoda.operator.main import CHILDREN
from pagoda.operator.metrics import REGISTRY
from pagoda.operator.render import render_children
from pagoda.operator.triggers import Triggers, owner_key

# So long that nothing in these tests can be the resync's doing.
NO_RESYNC = 3600.0


def test_every_owned_kind_is_watched() -> None:
    config = OperatorConfig()
    body = {"metadata": {"name": "chat", "namespace": NS}, "spec": {"model": "m", "replicas": 2}}
    present = render_children(parse(body, config), config, "key").present
    kinds = {child["kind"] for child in present}
    # Except the admin Secret: watching Secrets would need list and watch on
    # every Secret; the resync repairs it.
    assert (kinds - {"Secret"}) | {"Pod", "EndpointSlice"} <= set(CHILDREN)


def test_events_map_to_the_owning_llmservice() -> None:
    pod = {"metadata": {"namespace": NS, "labels": {"pagoda.dev/llmservice": "chat"}}}
    assert owner_key("Pod", pod) == (NS, "chat")
    endpoint_slice = {
        "metadata": {"namespace": NS, "labels": {"kubernetes.io/service-name": "chat"}}
    }
    assert owner_key("EndpointSlice", endpoint_slice) == (NS, "chat")
    assert owner_key("Pod", {"metadata": {"namespace": NS, "labels": {}}}) is None


async def test_a_poke_wakes_only_a_running_loop() -> None:
    triggers = Triggers()
    assert not triggers.poke((NS, "chat"))
    wake = triggers.register((NS, "chat"))
    assert triggers.poke((NS, "chat")) and wake.event.is_set()
    wake.event.clear()
    wake.generation = 3
    assert not triggers.poke_if_new_generation((NS, "chat"), 3)  # our own status write
    assert triggers.poke_if_new_generation((NS, "chat"), 4)
    triggers.unregister((NS, "chat"), wake)
    assert not triggers.poke((NS, "chat"))


def quiet(config: OperatorConfig) -> OperatorConfig:
    return dataclasses.replace(config, resync_seconds=NO_RESYNC)


async def test_a_deleted_child_is_restored_within_seconds(
    cluster: ApiServer, run_operator: Any, operator_config: OperatorConfig
) -> None:
    async with run_operator(quiet(operator_config)):
        await create(cluster, llmservice())
        await eventually(lambda: obj(cluster, SERVICES, "chat"))
        await delete(cluster, SERVICES, "chat")
        await eventually(lambda: obj(cluster, SERVICES, "chat"), timeout=5)


async def test_a_spec_change_is_applied_within_seconds(
    cluster: ApiServer, run_operator: Any, operator_config: OperatorConfig
) -> None:
    async with run_operator(quiet(operator_config)):
        await create(cluster, llmservice())
        await eventually(lambda: obj(cluster, DEPLOYMENTS, "chat"))
        await patch(
            cluster,
            path_of("pagoda.dev/v1alpha1/llmservices", NS, "chat") + "/scale",
            {"spec": {"replicas": 2}},
        )
        await eventually(
            lambda: obj(cluster, DEPLOYMENTS, "chat")["spec"]["replicas"] == 2, timeout=5
        )


async def test_pods_and_endpoints_move_the_status_within_seconds(
    cluster: ApiServer, run_operator: Any, operator_config: OperatorConfig
) -> None:
    async with run_operator(quiet(operator_config)):
        await create(cluster, llmservice())
        template = (await eventually(lambda: obj(cluster, DEPLOYMENTS, "chat")))["spec"]["template"]
        await eventually(lambda: condition(cluster, "chat", "Ready"))
        waiting = {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such tag"}}}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "chat-1", "namespace": NS, **template["metadata"]},
            "status": {"containerStatuses": [waiting]},
        }
        await create(cluster, pod)
        await eventually(
            lambda: condition(cluster, "chat", "Degraded")["reason"] == "ImagePullBackOff",
            timeout=5,
        )
        endpoint_slice = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "chat-1",
                "namespace": NS,
                "labels": {
                    "app.kubernetes.io/managed-by": "pagoda-operator",
                    "kubernetes.io/service-name": "chat",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}}],
        }
        await create(cluster, endpoint_slice)
        await eventually(lambda: condition(cluster, "chat", "Ready")["status"] == "True", timeout=5)


def resyncs() -> float:
    labels = {"trigger": "resync", "result": "ok"}
    return REGISTRY.get_sample_value("pagoda_operator_reconciles_total", labels) or 0.0


async def test_the_resync_period_is_the_operators_configuration(
    cluster: ApiServer, run_operator: Any, operator_config: OperatorConfig
) -> None:
    async with run_operator(dataclasses.replace(operator_config, resync_seconds=0.3)):
        await create(cluster, llmservice())
        await eventually(lambda: obj(cluster, DEPLOYMENTS, "chat"))
        before = resyncs()
        # Four resyncs inside 3.9 s cannot happen at the fixture's 1 s period;
        # polling (not a fixed sleep) keeps a loaded CI box from failing it.
        await eventually(lambda: resyncs() - before >= 4, timeout=3.9)
    async with run_operator(quiet(operator_config)):
        await asyncio.sleep(1.0)
        before = resyncs()
        await asyncio.sleep(2.0)
        assert resyncs() == before
