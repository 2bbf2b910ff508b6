"""Names, labels and the metadata every child of an LLMService carries."""

from __future__ import annotations

from typing import Any

from pagoda.operator.llmservice import LLMService
from pagoda.operator.model import API_VERSION, KIND

OWNER_LABEL = "pagoda.dev/llmservice"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "pagoda-operator"
RUNTIME_PORT = 8000
# The runtime's admin listener (`--admin-port`): the adapter routes, only for
# the operator; the Service never exposes it.
ADMIN_PORT = 8001
ADMIN_PORT_NAME = "admin"


def deployment_name(llms: LLMService) -> str:
    """The Deployment shares the LLMService's name, as KServe and KubeAI do."""
    return llms.name


def service_name(llms: LLMService) -> str:
    """The Service shares the name too, so the endpoint is http://NAME.NAMESPACE.svc."""
    return llms.name


def configmap_name(llms: LLMService) -> str:
    """The ConfigMap of engine arguments."""
    return f"{llms.name}-engine"


def adapters_configmap_name(llms: LLMService) -> str:
    """The ConfigMap holding the LoRA adapters file (mounted, not part of the pod template)."""
    return f"{llms.name}-adapters"


def admin_secret_name(llms: LLMService) -> str:
    """The Secret holding the admin port's key (the operator's credential to its pods)."""
    return f"{llms.name}-admin"


def pdb_name(llms: LLMService) -> str:
    """The PodDisruptionBudget (only while replicas > 1)."""
    return llms.name


def selector_labels(llms: LLMService) -> dict[str, str]:
    """The pods' selector. A Deployment's selector is immutable: never add to it."""
    return {"app.kubernetes.io/name": "pagoda-runtime", OWNER_LABEL: llms.name}


def labels(llms: LLMService) -> dict[str, str]:
    """Labels of every child and of the pods."""
    return {
        **selector_labels(llms),
        "app.kubernetes.io/instance": llms.name,
        "app.kubernetes.io/component": "inference",
        "app.kubernetes.io/part-of": "pagoda",
        MANAGED_BY_LABEL: MANAGED_BY,
    }


def owner_reference(llms: LLMService) -> dict[str, Any]:
    """The controller reference: children are garbage-collected with their LLMService."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": llms.name,
        "uid": llms.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(llms: LLMService, name: str) -> dict[str, Any]:
    """Metadata of a child object: name, namespace, labels, owner."""
    return {
        "name": name,
        "namespace": llms.namespace,
        "labels": labels(llms),
        "ownerReferences": [owner_reference(llms)],
    }


def selector_string(llms: LLMService) -> str:
    """The selector as a string, for the scale subresource (status.selector)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(llms).items()))
