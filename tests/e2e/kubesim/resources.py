"""The resources the simulated API server serves (what discovery answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock
from kubesim.crd import CustomResource

# The CRDs the project ships: served with their real schemas and CEL rules.
CRDS = (Path(__file__).resolve().parents[3] / "crds" / "llmservices.pagoda.dev.yaml",)

BUILT_IN: dict[str, dict[str, Any]] = {
    "apps/v1/deployments": {
        "kind": "Deployment",
        "namespaced": True,
        "subresources": {"status", "scale"},
    },
    "apps/v1/replicasets": {
        "kind": "ReplicaSet",
        "namespaced": True,
        "subresources": {"status", "scale"},
    },
    "policy/v1/poddisruptionbudgets": {
        "kind": "PodDisruptionBudget",
        "namespaced": True,
        "subresources": {"status"},
    },
    "discovery.k8s.io/v1/endpointslices": {"kind": "EndpointSlice", "namespaced": True},
    "v1/configmaps": {"kind": "ConfigMap", "namespaced": True},
    "v1/services": {"kind": "Service", "namespaced": True, "subresources": {"status"}},
    "v1/secrets": {"kind": "Secret", "namespaced": True},
    "v1/persistentvolumeclaims": {"kind": "PersistentVolumeClaim", "namespaced": True},
    "v1/pods": {"kind": "Pod", "namespaced": True, "subresources": {"status"}},
    "v1/events": {"kind": "Event", "namespaced": True},
    # The operator's replicas elect their leader on a Lease.
    "coordination.k8s.io/v1/leases": {"kind": "Lease", "namespaced": True},
    # kopf's backbone: it discovers namespaces (never lists them cluster-wide)
    # and watches CRDs to notice new resources.
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "kind": "CustomResourceDefinition",
        "namespaced": False,
        "verbs": {"list", "watch"},
    },
}


def custom_resources() -> list[CustomResource]:
    """The project's CRDs, read from crds/."""
    return [CustomResource.from_file(path) for path in CRDS]


PAGODA: dict[str, dict[str, Any]] = {crd.resource: crd.discovery() for crd in custom_resources()}

# KEDA's ScaledObject (autoscaling.mode keda): the operator applies and deletes it.
KEDA: dict[str, dict[str, Any]] = {
    "keda.sh/v1alpha1/scaledobjects": {
        "kind": "ScaledObject",
        "namespaced": True,
        "subresources": {"status"},
    },
}

ALL_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


def declare(server: kmock.KubernetesEmulator, *groups: dict[str, dict[str, Any]]) -> None:
    """Make the server discover these resources (all of them by default).

    Discovery must list the verbs: kopf watches only what says `watch`.
    """
    for group in groups or (BUILT_IN, PAGODA, KEDA):
        for key, info in group.items():
            server.resources[key] = {"verbs": ALL_VERBS, **info}
    if hasattr(server, "install") and (not groups or PAGODA in groups):
        for crd in custom_resources():
            server.install(crd)
