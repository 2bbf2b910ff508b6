"""What a write did to a child, told from the API server's answer.

The pure classification first, then the operator against an API server that
keeps other field managers' list entries through a force-apply, as a real one
does: their entries are not drift, a hand edit of our field is, once.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from kubesim.apiserver import STRATEGIC, ApiServer
from kubesim.testing import (
    DEPLOYMENTS,
    NS,
    create,
    events,
    eventually,
    llmservice,
    obj,
    patch,
    path_of,
    version,
)
from pagoda.operator.drift import (
    APPLIED_HASH,
    Action,
    applied_hash,
    changed_fields,
    classify,
    stamp,
)


def desired() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "ml", "labels": {"a": "1"}},
        "spec": {
            "replicas": 2,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "runtime",
                            "image": "img:1",
                            "env": [{"name": "LOG", "value": "info"}],
                        }
                    ]
                }
            },
        },
    }


def live_of(obj: dict[str, Any], version: str = "7") -> dict[str, Any]:
    """What the API server holds after an apply: our fields, plus its own and others'."""
    live = copy.deepcopy(stamp(obj))
    live["metadata"] |= {"uid": "x", "resourceVersion": version, "managedFields": []}
    container = live["spec"]["template"]["spec"]["containers"][0]
    container |= {"imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/x"}
    live["status"] = {"replicas": 2}
    return live


def with_version(obj: dict[str, Any], version: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = version
    return out


def test_a_missing_child_was_created() -> None:
    assert classify(desired(), None, live_of(desired())).action is Action.CREATE


def test_an_apply_that_changed_nothing_did_nothing() -> None:
    live = live_of(desired())
    assert classify(desired(), live, live).action is Action.NONE


def test_a_new_spec_is_an_update() -> None:
    changed = desired()
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "img:2"
    assert classify(changed, live_of(desired()), live_of(changed, "8")).action is Action.UPDATE


def test_a_field_we_stop_setting_is_an_update_too() -> None:
    fewer = desired()
    del fewer["metadata"]["labels"]
    assert classify(fewer, live_of(desired()), live_of(fewer, "8")).action is Action.UPDATE


def test_a_hand_edit_of_our_field_is_a_repair_naming_the_field() -> None:
    before = live_of(desired())
    before["spec"]["replicas"] = 9
    plan = classify(desired(), before, live_of(desired(), "8"))
    assert plan.action is Action.REPAIR and plan.drifted == ("spec.replicas",)


def test_a_hand_edit_inside_a_named_list_item_is_named() -> None:
    before = live_of(desired())
    before["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    plan = classify(desired(), before, live_of(desired(), "8"))
    assert plan.drifted == ("spec.template.spec.containers[runtime].image",)


def test_another_managers_list_entry_is_not_drift() -> None:
    # `kubectl set env` added EXTRA; a force-apply leaves it (another manager
    # owns it), so the object is the same before and after: nothing happened.
    live = live_of(desired())
    live["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "EXTRA", "value": "1"})
    assert classify(desired(), live, live).action is Action.NONE


def test_a_concurrent_change_of_a_field_we_do_not_render_is_not_drift() -> None:
    # The Deployment controller wrote the status between our read and our
    # apply: the version moved, but none of our fields did.
    before = live_of(desired())
    after = with_version(before, "8")
    after["status"] = {"replicas": 2, "readyReplicas": 2}
    assert classify(desired(), before, after).action is Action.NONE


def test_a_deleted_hash_annotation_is_an_update() -> None:
    live = live_of(desired())
    del live["metadata"]["annotations"][APPLIED_HASH]
    assert classify(desired(), live, live_of(desired(), "8")).action is Action.UPDATE


def test_the_hash_ignores_its_own_annotation() -> None:
    assert applied_hash(stamp(desired())) == applied_hash(desired())


def test_changed_fields_match_named_items_by_name_not_position() -> None:
    want = {"env": [{"name": "A", "value": "1"}]}
    before = {"env": [{"name": "X", "value": "0"}, {"name": "A", "value": "2"}]}
    after = {"env": [{"name": "X", "value": "0"}, {"name": "A", "value": "1"}]}
    assert changed_fields(want, before, after) == ["env[A].value"]
    assert changed_fields(want, after, after) == []


# --- against the simulated API server, whose apply keeps other managers' fields

MANAGED = "pagoda-operator"


def runtime(server: ApiServer) -> dict[str, Any]:
    return obj(server, DEPLOYMENTS, "chat")["spec"]["template"]["spec"]["containers"][0]


async def another_manager_patches_the_pod_template(
    server: ApiServer, manager: str, pod_spec: dict[str, Any]
) -> None:
    """What `kubectl set env` or a mutating webhook does: a strategic merge patch."""
    body = {"spec": {"template": {"spec": pod_spec}}}
    await patch(server, path_of(DEPLOYMENTS, NS, "chat"), body, STRATEGIC, fieldManager=manager)


async def test_an_env_var_another_manager_added_is_not_drift(operator: ApiServer) -> None:
    await create(operator, llmservice(env=[{"name": "LOG_LEVEL", "value": "info"}]))
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    await asyncio.sleep(0.5)
    extra = {"containers": [{"name": "runtime", "env": [{"name": "EXTRA", "value": "1"}]}]}
    await another_manager_patches_the_pod_template(operator, "kubectl-set", extra)
    settled = version(operator, DEPLOYMENTS, "chat")
    await asyncio.sleep(3.5)  # three resyncs, each force-applying the Deployment
    assert events(operator, "DriftRepaired") == []
    assert version(operator, DEPLOYMENTS, "chat") == settled
    assert [e["name"] for e in runtime(operator)["env"]] == [
        "PAGODA_ADMIN_KEY",
        "PAGODA_NUM_THREADS",
        "LOG_LEVEL",
        "EXTRA",
    ]
    owners = operator.owners_of(DEPLOYMENTS, NS, "chat")
    assert any("env[name=EXTRA]" in f for f in owners["kubectl-set"])
    assert not any("env[name=EXTRA]" in f for f in owners[MANAGED])


async def test_a_sidecar_another_manager_injected_survives_and_is_not_drift(
    operator: ApiServer,
) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    await asyncio.sleep(0.5)
    sidecar = {"containers": [{"name": "istio-proxy", "image": "istio/proxyv2:1.22"}]}
    await another_manager_patches_the_pod_template(operator, "sidecar-injector", sidecar)
    await asyncio.sleep(3.5)
    containers = obj(operator, DEPLOYMENTS, "chat")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["runtime", "istio-proxy"]
    assert events(operator, "DriftRepaired") == []


async def test_a_field_of_ours_changed_by_another_manager_is_repaired_once(
    operator: ApiServer,
) -> None:
    await create(operator, llmservice(env=[{"name": "LOG_LEVEL", "value": "info"}]))
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    await asyncio.sleep(0.5)
    edit = {"containers": [{"name": "runtime", "env": [{"name": "LOG_LEVEL", "value": "debug"}]}]}
    await another_manager_patches_the_pod_template(operator, "kubectl-edit", edit)
    await eventually(
        lambda: (
            {"name": "LOG_LEVEL", "value": "info"} in runtime(operator)["env"]
            and {"name": "LOG_LEVEL", "value": "debug"} not in runtime(operator)["env"]
        )
    )
    await asyncio.sleep(2.5)
    (event,) = events(operator, "DriftRepaired")
    assert "spec.template.spec.containers[runtime].env[LOG_LEVEL].value" in event["message"]
