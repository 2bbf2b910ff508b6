"""autoscaling.mode keda: a ScaledObject valid against KEDA's own CRD schema (vendored)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import LLMService, parse
from pagoda.operator.render import render_children
from pagoda.operator.render.scaledobject import render_scaled_object, wants_scaled_object

KEDA_CRD = Path(__file__).parent / "vendor" / "keda.sh_scaledobjects.yaml"
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
# The trigger metadata KEDA's Prometheus scaler reads (pkg/scalers/prometheus_scaler.go):
# the required keys, and every key this operator may set.
PROMETHEUS_REQUIRED = {"serverAddress", "query", "threshold"}
PROMETHEUS_KNOWN = PROMETHEUS_REQUIRED | {"activationThreshold", "ignoreNullValues"}


def strict(schema: Any) -> Any:
    """The CRD schema as the API server applies it: unknown fields are not kept.

    A structural schema prunes fields it does not declare, so a misspelt field
    would vanish silently; here it is an error instead.
    """
    schema = copy.deepcopy(schema)
    if isinstance(schema, dict):
        declared = schema.get("type") == "object" and "properties" in schema
        if (
            declared
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return {k: strict(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def keda_schema() -> dict[str, Any]:
    crd = next(d for d in yaml.safe_load_all(KEDA_CRD.read_text()) if d)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return strict(version["schema"]["openAPIV3Schema"])


def keda_service(**autoscaling: Any) -> LLMService:
    body = {
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u"},
        "spec": {
            "model": "m",
            "autoscaling": {
                "mode": "keda",
                "maxReplicas": 8,
                "keda": {"serverAddress": PROMETHEUS},
                **autoscaling,
            },
        },
    }
    return parse(body, OperatorConfig())


@pytest.mark.parametrize(
    "autoscaling",
    [
        {},
        {"minReplicas": 0, "targetRunningRequests": 8, "targetKVCacheUsage": 0.8},
        {"scaleDown": {"stabilizationSeconds": 60, "maxStepPods": 1}},
    ],
)
def test_the_scaled_object_is_valid_against_kedas_schema(autoscaling: dict[str, Any]) -> None:
    scaled = render_scaled_object(keda_service(**autoscaling))
    jsonschema.validate(scaled, keda_schema())
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["type"] == "prometheus"
        assert PROMETHEUS_REQUIRED <= set(trigger["metadata"]) <= PROMETHEUS_KNOWN
        assert all(isinstance(v, str) for v in trigger["metadata"].values())


def test_the_validation_catches_a_misspelt_field() -> None:
    scaled = render_scaled_object(keda_service())
    scaled["spec"]["maxReplicas"] = 8  # KEDA's name is maxReplicaCount
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, keda_schema())


def test_keda_scales_the_llmservice_on_the_same_signal_and_policy() -> None:
    spec = render_scaled_object(
        keda_service(minReplicas=0, targetQueueDepth=3, scaleUp={"maxStepPods": 2})
    )["spec"]
    # The LLMService's scale subresource, never the Deployment.
    assert spec["scaleTargetRef"] == {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "LLMService",
        "name": "chat",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 8)
    trigger, held = spec["triggers"]
    meta = trigger["metadata"]
    assert trigger["metricType"] == "AverageValue" and meta["threshold"] == "3"
    assert "vllm:num_requests_waiting" in meta["query"] and 'namespace="ml"' in meta["query"]
    assert 'pod=~"chat-[a-z0-9]+-[a-z0-9]+"' in meta["query"]
    # No data from Prometheus is an error (the HPA holds), never a zero.
    assert meta["ignoreNullValues"] == "false"
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert {p["type"]: p["value"] for p in behavior["scaleUp"]["policies"]} == {
        "Percent": 100,
        "Pods": 2,
    }
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (30, 300)
    # At zero pods the gateway's held requests are the demand that wakes the service.
    assert held["name"] == "held-requests" and held["metadata"]["threshold"] == "3"
    assert 'llmservice="chat"' in held["metadata"]["query"]


def test_only_a_service_that_may_scale_to_zero_reads_the_held_requests() -> None:
    from_zero = render_scaled_object(keda_service(minReplicas=0))["spec"]["triggers"]
    held = next(t for t in from_zero if t["name"] == "held-requests")
    # No gateway (no series) is no demand, not an error that blocks activation.
    assert held["metadata"]["query"].endswith("or vector(0)")
    assert held["metadata"]["ignoreNullValues"] == "true"
    assert held["metadata"]["activationThreshold"] == "0"
    queue = next(t for t in from_zero if t["name"] == "queue-depth")
    assert queue["metadata"]["ignoreNullValues"] == "false"
    floor = render_scaled_object(keda_service(minReplicas=1))["spec"]["triggers"]
    assert [t["name"] for t in floor] == ["queue-depth"]


def test_the_scaled_object_is_a_child_only_in_keda_mode() -> None:
    keda = render_children(keda_service(), OperatorConfig(), "key")
    assert [c["kind"] for c in keda.present][-1] == "ScaledObject"
    assert keda.present[-1]["metadata"]["ownerReferences"][0]["uid"] == "u"
    builtin = keda_service(mode="builtin")
    assert not wants_scaled_object(builtin)
    absent = render_children(builtin, OperatorConfig(), "key").absent
    assert ("ScaledObject", "chat") in [(a.kind, a.name) for a in absent]
    off = keda_service(enabled=False)
    assert not wants_scaled_object(off)
