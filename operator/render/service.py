"""The Service in front of the runtime pods: the OpenAI-compatible endpoint."""

from __future__ import annotations

from typing import Any

from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import LLMService
from pagoda.operator.render.labels import metadata, selector_labels, service_name


def render_service(llms: LLMService) -> dict[str, Any]:
    """The Service `NAME`, port spec.service.port -> the pods' `http` port."""
    spec = llms.spec.service
    meta = metadata(llms, service_name(llms))
    if spec.annotations:
        meta["annotations"] = dict(spec.annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": spec.type,
            "selector": selector_labels(llms),
            "ports": [
                {
                    "name": "http",
                    "port": spec.port,
                    "targetPort": "http",
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }


def endpoint(llms: LLMService, config: OperatorConfig) -> str:
    """The in-cluster base URL of the OpenAI API (what clients set as base_url)."""
    port = llms.spec.service.port
    host = f"{service_name(llms)}.{llms.namespace}.svc.{config.cluster_domain}"
    return f"http://{host}{'' if port == 80 else f':{port}'}/v1"
