"""A scale changes the Deployment, and nothing else the operator writes."""

from __future__ import annotations

import asyncio
from typing import Any

from kubesim.apiserver import ApiServer
from kubesim.testing import (
    CONFIGMAPS,
    DEPLOYMENTS,
    LLMS,
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


async def test_a_scale_leaves_the_adapters_configmap_alone(operator: ApiServer) -> None:
    spec: dict[str, Any] = {"lora": {}, "adapters": [{"name": "fr", "source": "/opt/fr"}]}
    await create(operator, llmservice(**spec))
    await eventually(lambda: obj(operator, CONFIGMAPS, "chat-adapters"))
    await eventually(lambda: obj(operator, LLMS, "chat")["status"]["conditions"])
    await asyncio.sleep(0.5)
    before = version(operator, CONFIGMAPS, "chat-adapters")
    await patch(operator, path_of(LLMS, NS, "chat") + "/scale", {"spec": {"replicas": 3}})
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat")["spec"]["replicas"] == 3)
    await asyncio.sleep(1.5)  # a resync too
    assert version(operator, CONFIGMAPS, "chat-adapters") == before
    assert not [e for e in events(operator, "Updated") if "chat-adapters" in e["message"]]
    # An adapter change still reaches the file, with the generation that made it.
    spec["adapters"].append({"name": "de", "source": "/opt/de"})
    changed = await patch(operator, path_of(LLMS, NS, "chat"), {"spec": spec})
    await eventually(
        lambda: '"de"' in obj(operator, CONFIGMAPS, "chat-adapters")["data"]["adapters.json"]
    )
    text = obj(operator, CONFIGMAPS, "chat-adapters")["data"]["adapters.json"]
    assert f'"generation": {changed["metadata"]["generation"]}' in text
