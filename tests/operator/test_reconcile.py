"""The reconcile's admin Secret against the simulated API server: made once,
applied on every pass with the value it already holds (a random value per
apply would lock the operator out of every running pod), and never read from
a namesake the LLMService does not own."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from kubesim.apiserver import ApiServer
from kubesim.testing import (
    DEPLOYMENTS,
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

SECRETS = "v1/secrets"
ADMIN = "chat-admin"


def key_of(server: ApiServer) -> str:
    return base64.b64decode(obj(server, SECRETS, ADMIN)["data"]["token"]).decode()


async def test_the_admin_secret_is_made_once_and_then_kept(operator: ApiServer) -> None:
    await create(operator, llmservice())
    secret = await eventually(lambda: obj(operator, SECRETS, ADMIN))
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-chat"
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
