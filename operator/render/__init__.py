"""Pure renderers: a validated LLMService in, the Kubernetes objects it needs out.

No function here talks to the cluster; each is tested by comparing dicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import LLMService
from pagoda.operator.render.configmap import render_adapters_configmap, render_configmap
from pagoda.operator.render.deployment import render_deployment
from pagoda.operator.render.labels import adapters_configmap_name, pdb_name
from pagoda.operator.render.pdb import render_pdb, wants_pdb
from pagoda.operator.render.scaledobject import (
    API_VERSION,
    KEDA_KIND,
    render_scaled_object,
    scaled_object_name,
    wants_scaled_object,
)
from pagoda.operator.render.secret import render_admin_secret
from pagoda.operator.render.service import render_service


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Enough to address one namespaced object through the API."""

    api_version: str
    kind: str
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Children:
    """What should exist (in apply order) and what should not."""

    present: tuple[dict[str, Any], ...]
    absent: tuple[ObjectRef, ...]


def render_children(llms: LLMService, config: OperatorConfig, admin_key: str | None) -> Children:
    """Every child of an LLMService. The ConfigMap and the admin Secret come
    before the pods that read them. `admin_key` is the admin Secret's key
    (render/secret.py); None leaves the Secret out (it could not be read, so
    it is neither written nor deleted)."""
    present = [render_configmap(llms), render_service(llms), render_deployment(llms, config)]
    if admin_key is not None:
        present.insert(1, render_admin_secret(llms, admin_key))
    absent = []
    # Before the pods that mount it; kept while LoRA is on, even with no adapter.
    if llms.spec.lora_enabled:
        present.insert(1, render_adapters_configmap(llms))
    else:
        absent.append(ObjectRef("v1", "ConfigMap", llms.namespace, adapters_configmap_name(llms)))
    if wants_pdb(llms):
        present.append(render_pdb(llms))
    else:
        absent.append(ObjectRef("policy/v1", "PodDisruptionBudget", llms.namespace, pdb_name(llms)))
    # Checked for removal even without autoscaling in the spec: a ScaledObject
    # left behind would go on scaling (a 404 where KEDA is not installed).
    if wants_scaled_object(llms):
        present.append(render_scaled_object(llms))
    else:
        absent.append(ObjectRef(API_VERSION, KEDA_KIND, llms.namespace, scaled_object_name(llms)))
    return Children(present=tuple(present), absent=tuple(absent))
