"""The rendered pod, read by the runtime's own `pagoda serve` parser.

The container arguments and the ConfigMap's PAGODA_* variables must mean to the
runtime exactly what the spec says: parse them with the runtime's parser (no
guessing at flag names or env twins) and compare.
"""

from __future__ import annotations

from typing import Any

import pytest
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import parse
from pagoda.operator.render.configmap import render_configmap
from pagoda.operator.render.deployment import render_deployment

SPEC: dict[str, Any] = {
    "model": "smollm2-135m-instruct",
    "servedModelName": "tiny-chat",
    "apiKeySecretRef": {"name": "keys"},
    "engine": {
        "maxModelLen": 2048,
        "maxNumSeqs": 8,
        "maxNumBatchedTokens": 512,
        "kvCacheMemory": 1.5,
        "gpuMemoryUtilization": 0.8,
        "dtype": "float32",
        "enablePrefixCaching": False,
    },
    "drain": {"timeoutSeconds": 45},
}


def test_runtime_reads_the_pod_as_the_spec_says(monkeypatch: pytest.MonkeyPatch) -> None:
    from pagoda.runtime.entrypoints.cli import build_parser
    from pagoda.runtime.entrypoints.openai.cli_args import server_config_from

    config = OperatorConfig()
    llms = parse({"metadata": {"name": "chat", "namespace": "ml"}, "spec": SPEC}, config)
    container = render_deployment(llms, config)["spec"]["template"]["spec"]["containers"][0]
    env = dict(render_configmap(llms)["data"])
    # The Secrets' values, as the kubelet would inject them from secretKeyRef.
    assert [v["name"] for v in container["env"][:2]] == ["PAGODA_API_KEY", "PAGODA_ADMIN_KEY"]
    env["PAGODA_API_KEY"] = "s3cret"
    env["PAGODA_ADMIN_KEY"] = "operator-only"
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the env twins are read when the parser is built

    assert container["command"] == ["pagoda", "serve"]
    ns = build_parser().parse_args(["serve", *container["args"]])
    engine, server = server_config_from(ns)

    assert engine.model == "smollm2-135m-instruct"
    assert (engine.max_model_len, engine.max_num_seqs, engine.max_num_batched_tokens) == (
        2048,
        8,
        512,
    )
    assert engine.kv_cache_memory_gib == 1.5 and engine.gpu_memory_utilization == 0.8
    assert engine.dtype == "float32" and engine.enable_prefix_caching is False
    assert (server.host, server.port) == ("0.0.0.0", container["ports"][0]["containerPort"])
    assert server.served_model_name == "tiny-chat"
    assert server.api_key == "s3cret"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (server.admin_port, server.admin_key) == (ports["admin"], "operator-only")
    assert server.drain_timeout == 45
