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
    assert cm["data"] == {"PAGODA_DTYPE": "auto"}


def test_every_engine_field_has_its_variable() -> None:
    data = render(
        engine={
            "maxModelLen": 8192,
            "maxNumSeqs": 128,
            "maxNumBatchedTokens": 4096,
            "gpuMemoryUtilization": 0.92,
            "kvCacheMemory": 4,
            "dtype": "bfloat16",
            "kvCacheDtype": "float16",
            "enablePrefixCaching": False,
        },
    )["data"]
    assert data == {
        "PAGODA_DTYPE": "bfloat16",
        "PAGODA_ENABLE_PREFIX_CACHING": "false",
        "PAGODA_GPU_MEMORY_UTILIZATION": "0.92",
        "PAGODA_KV_CACHE_DTYPE": "float16",
        "PAGODA_KV_CACHE_MEMORY_GIB": "4",
        "PAGODA_MAX_MODEL_LEN": "8192",
        "PAGODA_MAX_NUM_BATCHED_TOKENS": "4096",
        "PAGODA_MAX_NUM_SEQS": "128",
    }


def test_prefix_caching_on_is_spelled_true() -> None:
    data = render(engine={"enablePrefixCaching": True})["data"]
    assert data["PAGODA_ENABLE_PREFIX_CACHING"] == "true"


def test_every_variable_is_one_the_runtime_reads() -> None:
    # The runtime generates its env twins from EngineArgs' field names; a key it
    # does not know would be silently ignored in the pod.
    import dataclasses

    from pagoda.runtime.config import EngineArgs
    from pagoda.runtime.entrypoints.cli_args import env_name

    known = {env_name(f.name) for f in dataclasses.fields(EngineArgs)}
    full = render(
        engine={
            "maxModelLen": 64,
            "maxNumSeqs": 1,
            "maxNumBatchedTokens": 64,
            "gpuMemoryUtilization": 0.5,
            "kvCacheMemory": 1,
            "kvCacheDtype": "bfloat16",
            "enablePrefixCaching": True,
        }
    )["data"]
    assert set(full) <= known, set(full) - known


def adapters_body(generation: int | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "chat", "namespace": "ml", "uid": "u"}
    if generation is not None:
        meta["generation"] = generation
    return {
        "metadata": meta,
        "spec": {
            "model": "pvc://models/base",
            "adapters": [
                {"name": "sql", "source": "pvc://models/loras/sql"},
                {"name": "chat-fr", "source": "/opt/fr"},
            ],
        },
    }


def test_the_adapters_file_lists_pod_paths_in_spec_order_with_the_generation() -> None:
    import json

    from pagoda.operator.render.configmap import render_adapters_configmap
    from pagoda.runtime.entrypoints.openai.lora_file import AdaptersFile, parse_adapters_file

    cm = render_adapters_configmap(parse(adapters_body(generation=4), OperatorConfig()))
    kubernetes_validate.validate(cm, "1.30", strict=True)
    assert cm["metadata"]["name"] == "chat-adapters"
    text = cm["data"]["adapters.json"]
    # The runtime's own parser reads what the operator writes.
    assert parse_adapters_file(text) == AdaptersFile(
        {"sql": "/mnt/models/loras/sql", "chat-fr": "/opt/fr"}, generation=4
    )
    data = json.loads(text)
    assert data["generation"] == 4
    assert data["adapters"][0] == {"name": "sql", "path": "/mnt/models/loras/sql"}
    # One adapter a line: a diff of the ConfigMap shows which one changed.
    assert '\n    {"name": "chat-fr", "path": "/opt/fr"}\n' in text


def test_the_adapters_file_follows_the_generation_and_leaves_an_unknown_one_out() -> None:
    import json

    from pagoda.operator.render.configmap import adapters_file
    from pagoda.runtime.entrypoints.openai.lora_file import parse_adapters_file

    # Rendered with the spec's generation (the reconcile keeps the live file
    # while it lists the same adapters: stable_adapters_configmap).
    later = adapters_file(parse(adapters_body(generation=5), OperatorConfig()))
    assert parse_adapters_file(later).generation == 5
    unknown = adapters_file(parse(adapters_body(generation=None), OperatorConfig()))
    assert "generation" not in json.loads(unknown)
    assert parse_adapters_file(unknown).generation is None
    empty = {"metadata": {"name": "c", "generation": 2}, "spec": {"model": "m", "lora": {}}}
    assert json.loads(adapters_file(parse(empty, OperatorConfig()))) == {
        "generation": 2,
        "adapters": [],
    }


def test_a_spec_change_that_leaves_the_adapters_alone_leaves_the_file_alone() -> None:
    from pagoda.operator.render.configmap import (
        render_adapters_configmap,
        stable_adapters_configmap,
    )

    live = render_adapters_configmap(parse(adapters_body(generation=4), OperatorConfig()))
    # A scale (or an image change) moves the generation, not the adapters:
    # the ConfigMap stays as it is (no write, no Event, no refresh in the pods).
    scaled = render_adapters_configmap(parse(adapters_body(generation=9), OperatorConfig()))
    assert stable_adapters_configmap(scaled, live) == live
    # A change of the adapters carries the generation that made it.
    body = adapters_body(generation=10)
    body["spec"]["adapters"].pop()
    changed = render_adapters_configmap(parse(body, OperatorConfig()))
    assert stable_adapters_configmap(changed, live) == changed
    assert stable_adapters_configmap(scaled, None) == scaled
