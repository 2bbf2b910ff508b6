"""The KEDA ScaledObject of `autoscaling.mode: keda`: the same policy, run by KEDA.

For clusters that already run KEDA and a Prometheus that scrapes the runtime
pods. KEDA's HPA scales the LLMService itself through its scale subresource
(never the Deployment, exactly like the built-in autoscaler), on a Prometheus
query of the same signal: requests waiting, summed over this LLMService's
pods, against `targetQueueDepth` per replica (an HPA `AverageValue`). The
secondary signals become more triggers (HPA takes the largest), and the
scale-up and scale-down settings become the HPA's `behavior`.

`ignoreNullValues: "false"`: a query that returns nothing (Prometheus lost
the pods) is an error, on which the HPA keeps the count, rather than a 0 that
would scale down on missing data.

With no pods there is nothing for those queries to read, so with
`minReplicas: 0` they cannot wake the service: KEDA reads them as errors and
the ScaledObject never activates. The demand at zero is the requests that
the gateway in front of the pods holds while none can take them; a
`held-requests` trigger on that series (absent reads as 0: no gateway, no
demand) activates the ScaledObject, and KEDA takes it from 0 to 1 while the
pods' own triggers report errors.
"""

from __future__ import annotations

from typing import Any

from pagoda.operator.llmservice import LLMService
from pagoda.operator.model import GROUP, KIND, VERSION, AutoscalingSpec
from pagoda.operator.render.labels import deployment_name, metadata

API_VERSION = "keda.sh/v1alpha1"
KEDA_KIND = "ScaledObject"
# HPA's own period for its rate policies.
POLICY_PERIOD_SECONDS = 15


def scaled_object_name(llms: LLMService) -> str:
    """The ScaledObject shares the LLMService's name."""
    return llms.name


def wants_scaled_object(llms: LLMService) -> bool:
    """Whether this LLMService is scaled by KEDA."""
    auto = llms.spec.autoscaling
    return auto is not None and auto.enabled and auto.mode == "keda"


def pods_selector(llms: LLMService) -> str:
    """PromQL label matchers for this LLMService's pods (NAME-<hash>-<id>, Deployment names).

    PromQL regexes are anchored: another LLMService whose name starts with
    this one's (`chat-2` for `chat`) has one more dash-separated part and
    does not match.
    """
    return f'namespace="{llms.namespace}",pod=~"{deployment_name(llms)}-[a-z0-9]+-[a-z0-9]+"'


def queries(llms: LLMService) -> dict[str, str]:
    """PromQL of each signal, summed over the pods."""
    pods = pods_selector(llms)
    return {
        "queue": (
            f'sum({{__name__=~"vllm:num_requests_waiting|pagoda:num_requests_pending",{pods}}})'
        ),
        "running": f"sum(vllm:num_requests_running{{{pods}}})",
        "kv": f"sum(vllm:kv_cache_usage_perc{{{pods}}})",
    }


# Requests the gateway holds for an LLMService because no pod can take them
# (pagoda.gateway exports it, labelled with the LLMService's namespace and name).
HELD_REQUESTS_METRIC = "pagoda_gateway_held_requests"


def held_requests_query(llms: LLMService) -> str:
    """PromQL of the demand that exists with no pods: the gateway's held requests."""
    labels = f'namespace="{llms.namespace}",llmservice="{llms.name}"'
    return f"sum({HELD_REQUESTS_METRIC}{{{labels}}}) or vector(0)"


def _trigger(
    name: str, server: str, query: str, threshold: float, null_is_zero: bool = False
) -> dict[str, Any]:
    return {
        "type": "prometheus",
        "name": name,
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": server,
            "query": query,
            "threshold": f"{threshold:g}",
            "activationThreshold": "0",
            "ignoreNullValues": "true" if null_is_zero else "false",
        },
    }


def behavior(auto: AutoscalingSpec) -> dict[str, Any]:
    """The HPA behavior of the scale-up and scale-down settings."""
    up = auto.scale_up
    down = auto.scale_down
    scale_down: dict[str, Any] = {"stabilizationWindowSeconds": down.stabilization_seconds}
    if down.max_step_pods is not None:
        scale_down["policies"] = [
            {"type": "Pods", "value": down.max_step_pods, "periodSeconds": POLICY_PERIOD_SECONDS}
        ]
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": up.stabilization_seconds,
            "selectPolicy": "Max",
            "policies": [
                {
                    "type": "Percent",
                    "value": up.max_step_percent,
                    "periodSeconds": POLICY_PERIOD_SECONDS,
                },
                {"type": "Pods", "value": up.max_step_pods, "periodSeconds": POLICY_PERIOD_SECONDS},
            ],
        },
        "scaleDown": scale_down,
    }


def render_scaled_object(llms: LLMService) -> dict[str, Any]:
    """The ScaledObject `NAME`, targeting the LLMService's scale subresource."""
    auto = llms.spec.autoscaling
    assert auto is not None and auto.keda is not None  # the model's rule for mode keda
    server = auto.keda.server_address
    q = queries(llms)
    triggers = [_trigger("queue-depth", server, q["queue"], auto.target_queue_depth)]
    if auto.target_running_requests:
        triggers.append(
            _trigger("running-requests", server, q["running"], auto.target_running_requests)
        )
    if auto.target_kv_cache_usage:
        triggers.append(_trigger("kv-cache-usage", server, q["kv"], auto.target_kv_cache_usage))
    if auto.min_replicas == 0:
        triggers.append(
            _trigger(
                "held-requests",
                server,
                held_requests_query(llms),
                auto.target_queue_depth,
                null_is_zero=True,
            )
        )
    return {
        "apiVersion": API_VERSION,
        "kind": KEDA_KIND,
        "metadata": metadata(llms, scaled_object_name(llms)),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": llms.name,
            },
            "pollingInterval": auto.keda.polling_interval_seconds,
            "cooldownPeriod": auto.keda.cooldown_seconds,
            "minReplicaCount": auto.min_replicas,
            "maxReplicaCount": auto.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior(auto)}},
            "triggers": triggers,
        },
    }
