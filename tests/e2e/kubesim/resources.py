"""The resources the simulated API server serves (what discovery answers)."""

from __future__ import annotations

from typing import Any

import kmock

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
    # kopf's backbone: it discovers namespaces (never lists them cluster-wide)
    # and watches CRDs to notice new resources.
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "kind": "CustomResourceDefinition",
        "namespaced": False,
        "verbs": {"list", "watch"},
    },
}

PAGODA: dict[str, dict[str, Any]] = {
    "pagoda.dev/v1alpha1/llmservices": {
        "kind": "LLMService",
        "namespaced": True,
        "subresources": {"status", "scale"},
        "verbs": {"get", "list", "watch", "create", "update", "patch", "delete"},
    },
}

# KEDA's ScaledObject (autoscaling.mode keda): the operator applies and deletes it.
KEDA: dict[str, dict[str, Any]] = {
    "keda.sh/v1alpha1/scaledobjects": {
        "kind": "ScaledObject",
        "namespaced": True,
        "subresources": {"status"},
    },
}

KOPF_PEERING: dict[str, dict[str, Any]] = {
    "kopf.dev/v1/clusterkopfpeerings": {"kind": "ClusterKopfPeering", "namespaced": False},
    "kopf.dev/v1/kopfpeerings": {"kind": "KopfPeering", "namespaced": True},
}


ALL_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


def declare(server: kmock.KubernetesEmulator, *groups: dict[str, dict[str, Any]]) -> None:
    """Make the server discover these resources (all of them by default).

    Discovery must list the verbs: kopf watches only what says `watch`.
    """
    for group in groups or (BUILT_IN, PAGODA, KEDA, KOPF_PEERING):
        for key, info in group.items():
            server.resources[key] = {"verbs": ALL_VERBS, **info}
