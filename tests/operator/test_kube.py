"""Addressing objects through the API."""

from __future__ import annotations

from pagoda.operator.kube import Target, target_of


def test_core_and_group_paths() -> None:
    assert Target("Service", "ml", "chat").path() == "/api/v1/namespaces/ml/services/chat"
    assert Target("Deployment", "ml").path() == "/apis/apps/v1/namespaces/ml/deployments"
    assert (
        Target("PodDisruptionBudget", "ml", "chat").path()
        == "/apis/policy/v1/namespaces/ml/poddisruptionbudgets/chat"
    )


def test_target_of_a_rendered_object() -> None:
    obj = {"kind": "ConfigMap", "metadata": {"name": "chat-engine", "namespace": "ml"}}
    assert target_of(obj) == Target("ConfigMap", "ml", "chat-engine")
