"""One reconcile against the simulated API server, and its pure parts.

The admin Secret is made once and applied on every pass with the value it
already holds (a random value per apply would lock the operator out of every
running pod), and never read from a namesake the LLMService does not own.
Claims several replicas cannot share are reported; a spec that failed
validation is read leniently for the endpoints it needs.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from kubesim.apiserver import ApiServer
from kubesim.testing import (
    DEPLOYMENTS,
    LLMS,
    NS,
    condition,
    create,
    delete,
    events,
    eventually,
    llmservice,
    obj,
    patch,
    path_of,
    requests_to,
    version,
)
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import parse
from pagoda.operator.reconcile import claim_problems, last_need, most_replicas

SECRETS = "v1/secrets"
ADMIN = "chat-admin"


def key_of(server: ApiServer) -> str:
    return base64.b64decode(obj(server, SECRETS, ADMIN)["data"]["token"]).decode()


async def test_the_admin_secret_is_made_once_and_then_kept(operator: ApiServer) -> None:
    await create(operator, llmservice())
    secret = await eventually(lambda: obj(operator, SECRETS, ADMIN))
    assert (
        secret["metadata"]["ownerReferences"][0]["uid"]
        == obj(operator, LLMS, "chat")["metadata"]["uid"]
    )
    assert len(key_of(operator)) >= 43
    deployment = await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {
        "name": "PAGODA_ADMIN_KEY",
        "valueFrom": {"secretKeyRef": {"name": ADMIN, "key": "token"}},
    } in env
    await eventually(lambda: events(operator, "Created"))
    key, before = key_of(operator), version(operator, SECRETS, ADMIN)
    applies = len(requests_to(operator, "PATCH", f"/secrets/{ADMIN}"))
    await asyncio.sleep(3.5)  # three resyncs, each applying the Secret again
    assert len(requests_to(operator, "PATCH", f"/secrets/{ADMIN}")) >= applies + 3
    assert (key_of(operator), version(operator, SECRETS, ADMIN)) == (key, before)
    created = [e["message"] for e in events(operator, "Created")]
    assert created.count(f"Secret {ADMIN} created") == 1


async def test_a_key_changed_by_hand_is_kept(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, SECRETS, ADMIN))
    rotated = base64.b64encode(b"rotated-by-an-admin").decode()
    await patch(
        operator,
        path_of(SECRETS, NS, ADMIN),
        {"data": {"token": rotated}},
        fieldManager="kubectl-edit",
    )
    await asyncio.sleep(2.5)  # resyncs apply the Secret again
    assert key_of(operator) == "rotated-by-an-admin"


async def test_a_deleted_admin_secret_is_made_again(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, SECRETS, ADMIN))
    await delete(operator, SECRETS, ADMIN)
    restored = await eventually(lambda: obj(operator, SECRETS, ADMIN))
    assert restored["data"]["token"]


async def test_a_users_secret_of_that_name_is_neither_read_nor_written(
    operator: ApiServer,
) -> None:
    theirs: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": ADMIN, "namespace": NS},
        "data": {"token": base64.b64encode(b"theirs").decode()},
    }
    await create(operator, theirs)
    before = version(operator, SECRETS, ADMIN)
    await create(operator, llmservice())
    degraded = await eventually(lambda: condition(operator, "chat", "Degraded"))
    assert degraded["reason"] == "ChildConflict" and f"Secret {ADMIN}" in degraded["message"]
    await asyncio.sleep(1.5)
    assert version(operator, SECRETS, ADMIN) == before
    assert "pagoda-operator" not in operator.owners_of(SECRETS, NS, ADMIN)


def llms(**spec: Any) -> Any:
    body = {"metadata": {"name": "chat", "namespace": "ml"}, "spec": {"model": "m", **spec}}
    return parse(body, OperatorConfig())


def claim(*modes: str) -> dict[str, Any]:
    return {"metadata": {"name": "models"}, "spec": {"accessModes": list(modes)}}


@pytest.mark.parametrize(
    ("modes", "replicas", "reported"),
    [
        (("ReadWriteOnce",), 1, False),
        (("ReadWriteOnce",), 2, True),
        (("ReadWriteOncePod",), 2, True),
        (("ReadOnlyMany",), 4, False),
        (("ReadWriteMany",), 4, False),
        (("ReadWriteOnce", "ReadOnlyMany"), 4, False),  # the pods mount it read-only
        ((), 4, False),  # not bound yet: nothing known
    ],
)
def test_single_node_claims_with_several_replicas(
    modes: tuple[str, ...], replicas: int, reported: bool
) -> None:
    problems = claim_problems(llms(replicas=replicas), "spec.model", claim(*modes))
    assert bool(problems) == reported
    if reported:
        assert problems[0].reason == "SingleNodeVolume" and "models" in problems[0].message


def test_the_autoscalers_bound_counts_as_replicas() -> None:
    service = llms(replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 3})
    assert most_replicas(service) == 3
    assert claim_problems(service, "spec.model", claim("ReadWriteOnce"))


@pytest.mark.parametrize(
    ("spec", "need"),
    [
        ({}, 1),
        ({"replicas": 3, "minAvailable": 2}, 2),
        ({"replicas": 1, "minAvailable": 2}, 1),
        ({"replicas": "three", "minAvailable": True}, 1),
        ({"replicas": 0}, 1),
    ],
)
def test_the_need_of_a_spec_that_failed_validation(spec: dict[str, Any], need: int) -> None:
    assert last_need(spec) == need
