"""The spec model: defaults, ranges, and the CEL rules agreeing with their Python twins.

Every case runs twice: through the API server's admission as the generated CRD
describes it (schema + CEL, evaluated with cel-python) and through the
operator's pydantic model. The two must accept and reject the same specs, and
name the same field.
"""

from __future__ import annotations

from typing import Any

import pytest
from pagoda.operator.admission import check
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import InvalidSpec, parse
from pagoda.operator.model import LLMServiceSpec, ResourcesSpec


def body(spec: dict[str, Any], name: str = "chat") -> dict[str, Any]:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": spec,
    }


BASE = {"model": "smollm2-135m-instruct"}

# (spec, the field both must name or None when valid)
CASES: list[tuple[dict[str, Any], str | None]] = [
    (BASE, None),
    ({"model": "hf://meta-llama/Llama-3.1-8B-Instruct", "modelCache": {"claimName": "hf"}}, None),
    # An hf:// model is downloaded by the pods' init container: into a claim, or an emptyDir.
    ({"model": "hf://meta-llama/Llama-3.1-8B-Instruct"}, None),
    ({"model": "hf://meta-llama/Llama-3.1-8B-Instruct@v1.0"}, None),
    ({"model": "hf://org/m@0123456789abcdef0123456789abcdef01234567"}, None),
    ({"model": "hf://org/m@refs/pr/1"}, None),
    ({"model": "hf://org/m@"}, "spec.model"),
    ({"model": "hf://org/m@-x"}, "spec.model"),
    ({"model": "hf://org/m", "modelCache": {"sizeLimit": "40Gi"}}, None),
    ({**BASE, "modelCache": {"sizeLimit": "40Gi"}}, "spec.modelCache.sizeLimit"),
    ({"model": "hf://org/m", "modelCache": {"sizeLimit": "lots"}}, "spec.modelCache.sizeLimit"),
    ({"model": "hf://org/m", "modelCache": {}}, "spec.modelCache"),
    (
        {"model": "hf://org/m", "modelCache": {"claimName": "hf", "sizeLimit": "40Gi"}},
        "spec.modelCache",
    ),
    ({"model": "hf://org/m", "hfTokenSecretRef": {"name": "hf"}}, None),
    (
        {"model": "hf://org/m", "hfTokenSecretRef": {"name": "hf", "key": "a/b"}},
        "spec.hfTokenSecretRef.key",
    ),
    ({**BASE, "engine": {"extraArgs": ["--revision=v2"]}}, "spec.engine.extraArgs"),
    ({"model": "pvc://models/llama/8b"}, None),
    ({"model": "pvc://models"}, None),
    ({"model": "/opt/models/llama"}, None),
    ({"model": "s3://bucket/model"}, "spec.model"),
    # Tensor parallelism: one GPU per rank on GPU pods; ranks share the cores of a CPU pod.
    ({**BASE, "tensorParallelSize": 4, "resources": {"gpus": 4}}, None),
    ({**BASE, "tensorParallelSize": 2, "resources": {"gpus": 4}}, "spec.resources.gpus"),
    ({**BASE, "tensorParallelSize": 2, "resources": {"gpus": 4, "allowUnusedGpus": True}}, None),
    (
        {**BASE, "tensorParallelSize": 4, "resources": {"gpus": 2, "allowUnusedGpus": True}},
        "spec.resources.gpus",
    ),
    ({**BASE, "tensorParallelSize": 3}, None),
    ({**BASE, "tensorParallelSize": 3, "resources": {"gpus": 0}}, None),
    ({**BASE, "tensorParallelSize": 4, "resources": {"profile": "h100x4"}}, None),
    ({**BASE, "tensorParallelSize": 0}, "spec.tensorParallelSize"),
    ({**BASE, "tensorParallelSize": 17, "resources": {"gpus": 16}}, "spec.tensorParallelSize"),
    # One GPU per rank, unless the user opts in.
    ({**BASE, "resources": {"gpus": 1}}, None),
    ({**BASE, "resources": {"gpus": 4}}, "spec.resources.gpus"),
    ({**BASE, "resources": {"gpus": 4, "allowUnusedGpus": True}}, None),
    ({**BASE, "resources": {"gpus": 4, "allowUnusedGpus": False}}, "spec.resources.gpus"),
    ({**BASE, "resources": {"gpus": 17, "allowUnusedGpus": True}}, "spec.resources.gpus"),
    ({**BASE, "minAvailable": 2, "replicas": 3}, None),
    ({**BASE, "minAvailable": 0}, "spec.minAvailable"),
    ({**BASE, "scheduling": {"topologySpreadConstraints": []}}, None),
    ({**BASE, "resources": {"gpuType": "NVIDIA-H100-80GB-HBM3"}}, "spec.resources.gpuType"),
    ({**BASE, "resources": {"gpus": 1, "gpuType": "NVIDIA-H100-80GB-HBM3"}}, None),
    ({**BASE, "resources": {"cpu": 8, "memory": "64Gi", "sharedMemory": "16Gi"}}, None),
    ({**BASE, "resources": {"cpu": "500m"}}, None),
    ({**BASE, "resources": {"memory": "lots"}}, "spec.resources.memory"),
    ({**BASE, "engine": {"maxNumSeqs": 256, "maxNumBatchedTokens": 8192}}, None),
    (
        {**BASE, "engine": {"maxNumSeqs": 256, "maxNumBatchedTokens": 128}},
        "spec.engine.maxNumBatchedTokens",
    ),
    ({**BASE, "engine": {"dtype": "int4"}}, "spec.engine.dtype"),
    ({**BASE, "engine": {"dtype": "float32", "kvCacheDtype": "float16"}}, None),
    ({**BASE, "engine": {"kvCacheDtype": "fp8"}}, "spec.engine.kvCacheDtype"),
    ({**BASE, "engine": {"gpuMemoryUtilization": 0.9}}, None),
    ({**BASE, "engine": {"gpuMemoryUtilization": 0}}, "spec.engine.gpuMemoryUtilization"),
    ({**BASE, "engine": {"gpuMemoryUtilization": 1.5}}, "spec.engine.gpuMemoryUtilization"),
    ({**BASE, "engine": {"maxModelLen": 8}}, "spec.engine.maxModelLen"),
    ({**BASE, "engine": {"extraArgs": ["--enforce-eager", "--seed=1"]}}, None),
    ({**BASE, "engine": {"extraArgs": ["--port=9000"]}}, "spec.engine.extraArgs"),
    ({**BASE, "engine": {"extraArgs": ["--tensor-parallel-size"]}}, "spec.engine.extraArgs"),
    ({**BASE, "replicas": -1}, "spec.replicas"),
    ({**BASE, "replicas": 0}, None),
    ({**BASE, "service": {"type": "LoadBalancer", "port": 443}}, None),
    ({**BASE, "service": {"type": "ExternalName"}}, "spec.service.type"),
    ({**BASE, "service": {"port": 70000}}, "spec.service.port"),
    ({**BASE, "rollout": {"maxSurge": "25%", "maxUnavailable": 0}}, None),
    ({**BASE, "rollout": {"maxSurge": 0, "maxUnavailable": 1}}, None),
    ({**BASE, "rollout": {"maxSurge": 0}}, None),
    ({**BASE, "rollout": {"maxUnavailable": 0}, "resources": {"gpus": 1}}, None),
    ({**BASE, "rollout": {"maxSurge": 0, "maxUnavailable": "0%"}}, "spec.rollout"),
    ({**BASE, "rollout": {"maxSurge": "lots"}}, "spec.rollout.maxSurge"),
    ({**BASE, "drain": {"timeoutSeconds": 7200}}, "spec.drain.timeoutSeconds"),
    ({**BASE, "startupTimeoutSeconds": 5}, "spec.startupTimeoutSeconds"),
    ({**BASE, "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}, None),
    ({**BASE, "env": [{"name": "1BAD"}]}, "spec.env[0].name"),
    ({**BASE, "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "spec.env"),
    ({**BASE, "env": [{"name": "HF_HUB_OFFLINE", "value": "0"}]}, None),
    ({**BASE, "apiKeySecretRef": {"name": "k"}, "env": [{"name": "PAGODA_API_KEY"}]}, "spec.env"),
    ({**BASE, "env": [{"name": "PAGODA_API_KEY", "value": "sk-1"}]}, None),
    ({**BASE, "env": [{"name": "PAGODA_ADMIN_KEY", "value": "k"}]}, "spec.env"),
    (
        {**BASE, "modelCache": {"claimName": "hf"}, "env": [{"name": "HF_HOME", "value": "/x"}]},
        "spec.env",
    ),
    ({**BASE, "env": [{"name": "HF_HOME", "value": "/x"}]}, None),
    ({**BASE, "imagePullSecrets": ["a", "b"]}, None),
    ({**BASE, "imagePullSecrets": ["a", "a"]}, "spec.imagePullSecrets"),
    ({**BASE, "apiKeySecretRef": {"name": "keys"}}, None),
    ({**BASE, "apiKeySecretRef": {"name": "Not_A_Name"}}, "spec.apiKeySecretRef.name"),
    ({**BASE, "scheduling": {"tolerations": [{"key": "a", "operator": "Maybe"}]}}, None),
    # Autoscaling: bounds in order, positive targets, and replicas inside the bounds.
    ({**BASE, "autoscaling": {"maxReplicas": 4}}, None),
    ({**BASE, "autoscaling": {"minReplicas": 0, "maxReplicas": 4}}, None),
    ({**BASE, "autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, "spec.autoscaling.minReplicas"),
    ({**BASE, "autoscaling": {"maxReplicas": 0}}, "spec.autoscaling.maxReplicas"),
    # A count outside the bounds is the operator's to clamp (as HPA does), not an error:
    # a lower maxReplicas must not be refused because of the live count.
    ({**BASE, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}, None),
    ({**BASE, "replicas": 5, "autoscaling": {"maxReplicas": 4}}, None),
    ({**BASE, "replicas": 5, "autoscaling": {"maxReplicas": 4, "enabled": False}}, None),
    ({**BASE, "replicas": 2, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}, None),
    (
        {**BASE, "autoscaling": {"maxReplicas": 4, "targetQueueDepth": 0}},
        "spec.autoscaling.targetQueueDepth",
    ),
    ({**BASE, "autoscaling": {"maxReplicas": 4, "targetQueueDepth": 0.5}}, None),
    ({**BASE, "autoscaling": {"maxReplicas": 4, "targetKVCacheUsage": 0.8}}, None),
    (
        {**BASE, "autoscaling": {"maxReplicas": 4, "targetKVCacheUsage": 1.5}},
        "spec.autoscaling.targetKVCacheUsage",
    ),
    (
        {**BASE, "autoscaling": {"maxReplicas": 4, "targetRunningRequests": -1}},
        "spec.autoscaling.targetRunningRequests",
    ),
    (
        {**BASE, "autoscaling": {"maxReplicas": 4, "panicWindowSeconds": 90}},
        "spec.autoscaling.panicWindowSeconds",
    ),
    ({**BASE, "autoscaling": {"maxReplicas": 4, "mode": "keda"}}, "spec.autoscaling.keda"),
    (
        {
            **BASE,
            "autoscaling": {
                "maxReplicas": 4,
                "mode": "keda",
                "keda": {"serverAddress": "http://prometheus.monitoring:9090"},
            },
        },
        None,
    ),
    ({**BASE, "autoscaling": {"maxReplicas": 4, "mode": "hpa"}}, "spec.autoscaling.mode"),
    (
        {**BASE, "autoscaling": {"maxReplicas": 4, "scaleDown": {"stabilizationSeconds": -5}}},
        "spec.autoscaling.scaleDown.stabilizationSeconds",
    ),
    # LoRA adapters: unique names, a source pattern, hf:// needs the cache, at most 64.
    ({**BASE, "adapters": [{"name": "sql", "source": "pvc://loras/sql"}]}, None),
    ({**BASE, "adapters": [{"name": "sql", "source": "/opt/loras/sql"}]}, None),
    ({**BASE, "lora": {"maxLoras": 2, "maxLoraRank": 64}}, None),
    (
        {
            **BASE,
            "adapters": [
                {"name": "sql", "source": "/a"},
                {"name": "sql", "source": "/b"},
            ],
        },
        "spec.adapters",
    ),
    ({**BASE, "adapters": [{"name": "bad name", "source": "/a"}]}, "spec.adapters[0].name"),
    ({**BASE, "adapters": [{"name": "sql", "source": "s3://x/y"}]}, "spec.adapters[0].source"),
    ({**BASE, "adapters": [{"name": "sql", "source": "hf://org/sql-lora"}]}, "spec.modelCache"),
    (
        {
            "model": "hf://org/m",
            "modelCache": {"sizeLimit": "1Gi"},
            "adapters": [{"name": "sql", "source": "hf://org/sql-lora"}],
        },
        "spec.modelCache",
    ),
    (
        {
            **BASE,
            "modelCache": {"claimName": "hf"},
            "adapters": [{"name": "sql", "source": "hf://org/sql-lora/sub"}],
        },
        None,
    ),
    (
        {**BASE, "adapters": [{"name": f"a{i}", "source": "/a"} for i in range(65)]},
        "spec.adapters",
    ),
    ({**BASE, "lora": {"maxLoras": 0}}, "spec.lora.maxLoras"),
    ({**BASE, "engine": {"extraArgs": ["--max-loras=8"]}}, "spec.engine.extraArgs"),
]


def _agree_field(errors: list[str], field: str) -> bool:
    # Admission names ".env.0.name" style paths from jsonschema; normalise them.
    want = field.replace("[", ".").replace("]", "")
    return any(e.split(":")[0].replace("[", ".").replace("]", "").startswith(want) for e in errors)


@pytest.mark.parametrize(("spec", "field"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_admission_and_model_agree(spec: dict[str, Any], field: str | None) -> None:
    if spec.get("scheduling", {}).get("tolerations", [{}])[0].get("operator") == "Maybe":
        field = "spec.scheduling.tolerations[0].operator"
    errors = check(body(spec))
    config = OperatorConfig(profiles={"h100x4": LLMServiceSpec.model_validate(
        {"model": "x", "resources": {"gpus": 4, "allowUnusedGpus": True}}).resources})  # fmt: skip
    try:
        parse(body(spec), config)
        problem = None
    except InvalidSpec as e:
        problem = e
    if field is None:
        assert errors == [] and problem is None, (errors, problem)
    else:
        assert errors and _agree_field(errors, field), errors
        assert problem is not None and problem.field == field, problem


def test_defaults_fill_a_minimal_spec() -> None:
    spec = LLMServiceSpec.model_validate(BASE)
    assert spec.replicas == 1 and spec.tensor_parallel_size == 1
    assert spec.engine.dtype == "auto" and spec.engine.extra_args == []
    assert spec.service.type == "ClusterIP" and spec.service.port == 80
    assert (spec.rollout.max_surge, spec.rollout.max_unavailable) == (None, None)
    assert spec.min_available == 1
    assert (spec.drain.timeout_seconds, spec.drain.pre_stop_seconds) == (60, 5)
    assert spec.startup_timeout_seconds == 1800


def test_unknown_fields_are_ignored_and_listed_not_rejected() -> None:
    # A newer CRD's fields: an older operator keeps serving the object.
    spec = {
        **BASE,
        "guardrails": [{"name": "pii"}],
        "adapters": [{"name": "sql", "source": "/a", "rank": 8}],
        "engine": {"maxModelLen": 512, "speculative": {"k": 4}},
        "env": [{"name": "A", "value": "1", "secretRef": "x"}],
    }
    llms = parse(body(spec), OperatorConfig())
    assert llms.spec.engine.max_model_len == 512
    assert llms.ignored_fields == (
        "spec.guardrails",
        "spec.adapters[0].rank",
        "spec.engine.speculative",
        "spec.env[0].secretRef",
    )
    assert llms.spec.env[0].model_dump(by_alias=True, exclude_none=True) == {
        "name": "A",
        "value": "1",
    }
    assert check(body(spec)) == []  # a real API server prunes them; the schema allows it


def test_gpu_and_tensor_parallel_caps_agree() -> None:
    from pagoda.operator import crd

    spec = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    gpus = spec["properties"]["resources"]["properties"]["gpus"]["maximum"]
    assert spec["properties"]["tensorParallelSize"]["maximum"] == gpus


def test_a_profile_is_checked_after_it_is_resolved() -> None:
    config = OperatorConfig(profiles={"x4": ResourcesSpec(gpus=4)})
    with pytest.raises(InvalidSpec) as e:
        parse(body({**BASE, "resources": {"profile": "x4"}}), config)
    assert e.value.field == "spec.resources.gpus"
    opted_in = {**BASE, "resources": {"profile": "x4", "allowUnusedGpus": True}}
    assert parse(body(opted_in), config).resources.gpus == 4


def test_name_must_be_a_dns_label() -> None:
    with pytest.raises(InvalidSpec) as e:
        parse(body(BASE, name="9lives"), OperatorConfig())
    assert e.value.field == "metadata.name"
    assert check(body(BASE, name="9lives"))


def test_an_adapter_may_not_take_the_served_model_name() -> None:
    spec = {**BASE, "adapters": [{"name": "chat", "source": "/a"}]}
    with pytest.raises(InvalidSpec) as caught:
        parse(body(spec, name="chat"), OperatorConfig())
    assert caught.value.field == "spec.adapters[0].name"
    parse(body({**spec, "servedModelName": "base"}, name="chat"), OperatorConfig())
