"""The PodDisruptionBudget exists only with more than one replica."""

from __future__ import annotations

import kubernetes_validate
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import parse
from pagoda.operator.render import render_children
from pagoda.operator.render.pdb import render_pdb, wants_pdb


def llms(replicas: int):  # type: ignore[no-untyped-def]
    body = {
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u"},
        "spec": {"model": "m", "replicas": replicas},
    }
    return parse(body, OperatorConfig())


def test_budget_evicts_one_pod_at_a_time() -> None:
    pdb = render_pdb(llms(3))
    kubernetes_validate.validate(pdb, "1.30", strict=True)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_budget_only_above_one_replica() -> None:
    assert [wants_pdb(llms(n)) for n in (0, 1, 2)] == [False, False, True]


def test_children_list_the_budget_as_absent_when_not_wanted() -> None:
    one = render_children(llms(1), OperatorConfig(), "key")
    assert [c["kind"] for c in one.present] == ["ConfigMap", "Secret", "Service", "Deployment"]
    assert ("PodDisruptionBudget", "chat") in [(a.kind, a.name) for a in one.absent]
    three = render_children(llms(3), OperatorConfig(), "key")
    assert [c["kind"] for c in three.present][-1] == "PodDisruptionBudget"
    assert "PodDisruptionBudget" not in [a.kind for a in three.absent]
