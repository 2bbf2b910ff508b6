"""The ConfigMap of engine arguments (PAGODA_* variables)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import parse
from pagoda.operator.render.configmap import render_configmap


def render(**spec: Any) -> dict[str, Any]:
    body = {
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u"},
        "spec": {"model": "m", **spec},
    }
    cm = render_configmap(parse(body, OperatorConfig()))
    kubernetes_validate.validate(cm, "1.30", strict=True)
    return cm


def test_defaults_set_only_what_the_operator_decides() -> None:
    cm = render()
    assert cm["metadata"]["name"] == "chat-engine"
    assert cm["data"] == {
        "PAGODA_DRAIN_TIMEOUT": "60",
        "PAGODA_DTYPE": "auto",
        "PAGODA_SERVED_MODEL_NAME": "chat",
        "PAGODA_TENSOR_PARALLEL_SIZE": "1",
    }


def test_every_engine_field_has_its_variable() -> None:
    data = render(
        servedModelName="llama-3-8b",
        tensorParallelSize=2,
        resources={"gpus": 2},
        engine={
            "maxModelLen": 8192,
            "maxNumSeqs": 128,
            "maxNumBatchedTokens": 4096,
            "gpuMemoryUtilization": 0.92,
            "kvCacheMemory": 4,
            "dtype": "bfloat16",
            "enablePrefixCaching": False,
        },
        drain={"timeoutSeconds": 300},
    )["data"]
    assert data == {
        "PAGODA_DRAIN_TIMEOUT": "300",
        "PAGODA_DTYPE": "bfloat16",
        "PAGODA_ENABLE_PREFIX_CACHING": "false",
        "PAGODA_GPU_MEMORY_UTILIZATION": "0.92",
        "PAGODA_KV_CACHE_MEMORY": "4",
        "PAGODA_MAX_MODEL_LEN": "8192",
        "PAGODA_MAX_NUM_BATCHED_TOKENS": "4096",
        "PAGODA_MAX_NUM_SEQS": "128",
        "PAGODA_SERVED_MODEL_NAME": "llama-3-8b",
        "PAGODA_TENSOR_PARALLEL_SIZE": "2",
    }


def test_prefix_caching_on_is_spelled_true() -> None:
    assert (
        render(engine={"enablePrefixCaching": True})["data"]["PAGODA_ENABLE_PREFIX_CACHING"]
        == "true"
    )
