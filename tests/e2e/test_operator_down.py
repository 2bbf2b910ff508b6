"""What users can still do while the operator is down or uninstalled: delete.

LLMServices carry no finalizer, so deleting one (or its namespace) never
waits for the operator; the garbage collector removes the children. The
LLMServices have no replicas, so no model pod starts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubesim.apiserver import ApiServer
from kubesim.cluster import Cluster
from kubesim.operator import OperatorThread
from kubesim.testing import llmservice
from pagoda.operator.handlers import FINALIZER

from .conftest import CONFIG


@pytest.fixture()
async def node(kmock: ApiServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    """The cluster without an operator: each test starts and stops it."""
    async with Cluster(kmock, tmp_path) as running:
        yield running


def finalizers(node: Cluster, name: str) -> list[str]:
    found = node.get("LLMService", name)
    assert found is not None, f"LLMService {name} is gone"
    return list(found["metadata"].get("finalizers") or [])


async def test_an_llmservice_deleted_while_the_operator_is_down_goes_with_its_children(
    node: Cluster,
) -> None:
    async with OperatorThread(CONFIG):
        await node.create(llmservice("chat", replicas=0))
        await node.wait_for(lambda: node.get("Deployment", "chat"), 30, "the Deployment")
        await node.wait_for(lambda: node.condition("chat", "Ready"), 30, "a status")
        assert finalizers(node, "chat") == []
    # The operator is gone (an uninstall, a crash loop): deleting still works.
    await node.delete("LLMService", "chat")
    await node.wait_for(lambda: node.get("LLMService", "chat") is None, 10, "the LLMService gone")
    await node.wait_for(
        lambda: node.get("Deployment", "chat") is None and node.get("Service", "chat") is None,
        30,
        "the children collected",
    )


async def test_the_finalizer_an_earlier_operator_added_is_removed_on_start(node: Cluster) -> None:
    for name in ("kept", "dying"):
        body = llmservice(name, replicas=0)
        body["metadata"]["finalizers"] = [FINALIZER]
        await node.create(body)
    # Deleted while no operator runs: held in Terminating by the old finalizer.
    await node.delete("LLMService", "dying")
    dying = node.get("LLMService", "dying")
    assert dying is not None and dying["metadata"]["deletionTimestamp"]

    async with OperatorThread(CONFIG):
        await node.wait_for(lambda: node.get("LLMService", "dying") is None, 30, "dying released")
        await node.wait_for(lambda: finalizers(node, "kept") == [], 30, "the finalizer removed")
        await node.wait_for(lambda: node.get("Deployment", "kept"), 30, "kept reconciled")
    assert node.get("Deployment", "dying") is None
