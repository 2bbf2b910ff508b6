"""The Service renderer and the endpoint URL."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import parse
from pagoda.operator.render.service import endpoint, render_service


def llms(**spec: Any) -> Any:
    body = {
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u"},
        "spec": {"model": "m", **spec},
    }
    return parse(body, OperatorConfig())


def test_default_is_a_cluster_ip_on_port_80_to_the_http_port() -> None:
    svc = render_service(llms())
    kubernetes_validate.validate(svc, "1.30", strict=True)
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"}
    ]
    assert svc["spec"]["selector"] == {
        "app.kubernetes.io/name": "pagoda-runtime",
        "pagoda.dev/llmservice": "chat",
    }
    assert "annotations" not in svc["metadata"]


def test_type_port_and_annotations() -> None:
    annotations = {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}
    svc = render_service(
        llms(service={"type": "LoadBalancer", "port": 8080, "annotations": annotations})
    )
    kubernetes_validate.validate(svc, "1.30", strict=True)
    assert svc["spec"]["type"] == "LoadBalancer" and svc["spec"]["ports"][0]["port"] == 8080
    assert svc["metadata"]["annotations"] == annotations


def test_endpoint_names_the_port_only_when_not_80() -> None:
    assert endpoint(llms(), OperatorConfig()) == "http://chat.ml.svc.cluster.local/v1"
    config = OperatorConfig(cluster_domain="k8s.internal")
    assert (
        endpoint(llms(service={"port": 8000}), config) == "http://chat.ml.svc.k8s.internal:8000/v1"
    )


def test_the_admin_port_is_never_exposed() -> None:
    for spec in (
        {},
        {"service": {"type": "LoadBalancer"}},
        {"adapters": [{"name": "a", "source": "/a"}]},
    ):
        ports = render_service(llms(**spec))["spec"]["ports"]
        assert [p["targetPort"] for p in ports] == ["http"]
