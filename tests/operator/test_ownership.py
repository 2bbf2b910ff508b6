"""An object this LLMService does not own is never adopted, overwritten or deleted."""

from __future__ import annotations

import asyncio
from typing import Any

from kubesim.apiserver import ApiServer
from kubesim.testing import (
    CONFIGMAPS,
    DEPLOYMENTS,
    LLMS,
    NS,
    PDBS,
    SERVICES,
    condition,
    create,
    delete,
    events,
    eventually,
    exists,
    llmservice,
    obj,
    version,
)
from pagoda.operator.ownership import conflict, holder, owned_by


def child(uid: str | None, kind: str = "Service") -> dict[str, Any]:
    refs = [{"kind": "LLMService", "name": "chat", "uid": uid, "controller": True}] if uid else []
    return {"kind": kind, "metadata": {"name": "chat", "ownerReferences": refs}}


def test_a_child_is_ours_only_with_our_uid() -> None:
    assert owned_by(child("uid-1"), "uid-1")
    assert not owned_by(child("uid-2"), "uid-1")  # a namesake from a deleted LLMService
    assert not owned_by(child(None), "uid-1")
    assert not owned_by(child("uid-1"), None)


def test_a_conflict_names_the_object_and_its_holder() -> None:
    assert conflict("Service", None, "uid-1") is None
    assert conflict("Service", child("uid-1"), "uid-1") is None
    found = conflict("Service", child(None), "uid-1")
    assert found is not None and found.message().startswith("Service chat already exists")
    assert "it has no owner" in found.message()
    other = {"metadata": {"ownerReferences": [{"kind": "HelmRelease", "name": "web", "uid": "h"}]}}
    assert holder(other) == "owned by HelmRelease web"


def users(kind: str, name: str, **body: Any) -> dict[str, Any]:
    api_version = {"PodDisruptionBudget": "policy/v1"}.get(kind, "v1")
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": NS, "labels": {"owner": "a-user"}},
        **body,
    }


USERS_SERVICE = users(
    "Service", "chat", spec={"selector": {"app": "mine"}, "ports": [{"port": 443}]}
)


async def test_a_users_service_of_the_same_name_is_left_alone(operator: ApiServer) -> None:
    await create(operator, USERS_SERVICE)
    before = version(operator, SERVICES, "chat")
    await create(operator, llmservice())
    degraded = await eventually(lambda: condition(operator, "chat", "Degraded"))
    assert (degraded["status"], degraded["reason"]) == ("True", "ChildConflict")
    assert "Service chat already exists" in degraded["message"]
    assert condition(operator, "chat", "Ready")["reason"] == "ChildConflict"
    (event,) = await eventually(lambda: events(operator, "ChildConflict"))
    assert event["type"] == "Warning" and "Service chat" in event["message"]
    # The other children are still applied; the user's Service is untouched.
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    await asyncio.sleep(1.5)  # a resync or two
    assert version(operator, SERVICES, "chat") == before
    assert "pagoda-operator" not in operator.owners_of(SERVICES, NS, "chat")
    assert obj(operator, SERVICES, "chat")["spec"]["selector"] == {"app": "mine"}


async def test_once_the_name_is_free_the_operator_creates_its_own(operator: ApiServer) -> None:
    await create(operator, USERS_SERVICE)
    await create(operator, llmservice())
    await eventually(lambda: condition(operator, "chat", "Degraded")["reason"] == "ChildConflict")
    await delete(operator, SERVICES, "chat")
    mine = await eventually(
        lambda: obj(operator, SERVICES, "chat")["metadata"].get("ownerReferences")
    )
    assert mine[0]["uid"] == obj(operator, LLMS, "chat")["metadata"]["uid"]
    await eventually(lambda: condition(operator, "chat", "Degraded")["status"] == "False")


async def test_a_configmap_owned_by_another_object_is_left_alone(operator: ApiServer) -> None:
    foreign = users("ConfigMap", "chat-engine", data={"mine": "yes"})
    foreign["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "uid-other"}
    ]
    await create(operator, foreign)
    await create(operator, llmservice())
    degraded = await eventually(
        lambda: (
            condition(operator, "chat", "Degraded")["reason"] == "ChildConflict"
            and condition(operator, "chat", "Degraded")
        )
    )
    assert (
        "ConfigMap chat-engine" in degraded["message"] and "ConfigMap other" in degraded["message"]
    )
    assert obj(operator, CONFIGMAPS, "chat-engine")["data"] == {"mine": "yes"}


async def test_a_users_budget_is_never_deleted(operator: ApiServer) -> None:
    # One replica wants no budget of ours; the user's own stays where it is.
    budget = users("PodDisruptionBudget", "chat", spec={"minAvailable": 1})
    await create(operator, budget)
    await create(operator, llmservice(replicas=1))
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    await asyncio.sleep(1.5)
    assert exists(operator, PDBS, "chat")
    assert obj(operator, PDBS, "chat")["spec"] == {"minAvailable": 1}
    assert events(operator, "Deleted") == []
    assert condition(operator, "chat", "Degraded")["status"] == "False"
