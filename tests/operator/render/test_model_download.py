"""The download init container and the cache volume of hf:// models."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import parse
from pagoda.operator.render.deployment import render_deployment

CONFIG = OperatorConfig(runtime_image="registry.test/runtime:1")
HF = "hf://acme/tiny-llama"


def render(**spec: Any) -> dict[str, Any]:
    body = {"metadata": {"name": "chat", "namespace": "ml", "uid": "u-1"}, "spec": spec}
    deployment = render_deployment(parse(body, CONFIG), CONFIG)
    kubernetes_validate.validate(deployment, "1.30", strict=True)
    return deployment


def pod(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return pod(deployment)["containers"][0]


def init(d: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod(d)["initContainers"]
    return only


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_an_hf_model_is_downloaded_by_an_init_container_of_the_runtime_image() -> None:
    d = render(model=HF)
    c = init(d)
    assert c["name"] == "model-download"
    assert c["image"] == container(d)["image"] == "registry.test/runtime:1"
    assert c["command"] == ["pagoda", "download"]
    assert c["args"] == [HF, "--host", "0.0.0.0", "--port", "8000"]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert c["securityContext"] == container(d)["securityContext"]
    assert env(c)["HF_HOME"] == "/var/cache/pagoda/huggingface"
    assert env(c)["HF_HUB_OFFLINE"] == "0"  # the image's default is offline


def test_without_a_claim_the_cache_is_the_pods_own_emptydir() -> None:
    d = render(model=HF)
    (volume,) = [v for v in pod(d)["volumes"] if v["name"] == "hf-cache"]
    assert volume == {"name": "hf-cache", "emptyDir": {}}
    assert init(d)["volumeMounts"] == [
        {"name": "hf-cache", "mountPath": "/var/cache/pagoda/huggingface", "readOnly": False}
    ]
    assert container(d)["volumeMounts"] == [
        {"name": "hf-cache", "mountPath": "/var/cache/pagoda/huggingface", "readOnly": True}
    ]


def test_a_size_limit_bounds_the_emptydir_and_the_download() -> None:
    d = render(model=HF, modelCache={"sizeLimit": "40Gi"})
    (volume,) = [v for v in pod(d)["volumes"] if v["name"] == "hf-cache"]
    assert volume["emptyDir"] == {"sizeLimit": "40Gi"}
    assert init(d)["args"][-2:] == ["--size-limit", "40Gi"]


def test_the_runtime_starts_offline_on_the_downloaded_revision() -> None:
    d = render(model=HF + "@v1.2")
    c = container(d)
    assert c["args"][:3] == ["acme/tiny-llama", "--revision", "v1.2"]
    assert env(c)["HF_HUB_OFFLINE"] == "1"
    assert init(d)["args"][0] == HF + "@v1.2"


def test_the_token_reaches_the_download_only() -> None:
    d = render(model=HF, hfTokenSecretRef={"name": "hf"})
    assert env(init(d))["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert "HF_TOKEN" not in env(container(d))


def test_user_env_reaches_the_download_except_what_it_must_own() -> None:
    d = render(
        model=HF,
        env=[
            {"name": "HF_ENDPOINT", "value": "https://mirror.example"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "0"},
        ],
    )
    names = [e["name"] for e in init(d)["env"]]
    assert len(names) == len(set(names))  # a list-map keyed by name
    assert env(init(d))["HF_ENDPOINT"] == "https://mirror.example"
    assert env(init(d))["HF_HUB_OFFLINE"] == "0"
    assert env(init(d))["HF_HUB_DISABLE_TELEMETRY"] == "0"


def test_a_user_hf_token_variable_is_kept_without_a_secret_ref() -> None:
    token = {"secretKeyRef": {"name": "mine", "key": "t"}}
    d = render(model=HF, env=[{"name": "HF_TOKEN", "valueFrom": token}])
    assert env(init(d))["HF_TOKEN"] == token


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "pvc://models/m", "/opt/m"])
def test_other_models_have_no_init_container(model: str) -> None:
    assert "initContainers" not in pod(render(model=model))


def test_hf_adapters_on_a_claim_keep_it_read_only_and_download_nothing() -> None:
    d = render(
        model="smollm2-135m-instruct",
        modelCache={"claimName": "hf"},
        adapters=[{"name": "a", "source": "hf://org/l"}],
    )
    assert "initContainers" not in pod(d)
    (volume,) = [v for v in pod(d)["volumes"] if v["name"] == "hf-cache"]
    assert volume["persistentVolumeClaim"] == {"claimName": "hf", "readOnly": True}


def test_the_download_is_read_by_the_runtimes_own_parser(monkeypatch) -> None:
    from pagoda.runtime.entrypoints.cli import build_parser
    from pagoda.runtime.entrypoints.openai.cli_args import server_config_from

    config = OperatorConfig()
    body = {
        "metadata": {"name": "chat", "namespace": "ml"},
        "spec": {"model": HF + "@v2", "modelCache": {"sizeLimit": "2Gi"}},
    }
    spec = render_deployment(parse(body, config), config)["spec"]["template"]["spec"]
    c = spec["initContainers"][0]
    ns = build_parser().parse_args([c["command"][1], *c["args"]])
    assert (ns.model, ns.port, ns.size_limit) == (HF + "@v2", 8000, 2 << 30)
    serve = build_parser().parse_args(["serve", *spec["containers"][0]["args"]])
    engine, _ = server_config_from(serve)
    assert (engine.model, engine.revision) == ("acme/tiny-llama", "v2")
