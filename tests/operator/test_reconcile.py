"""The pure parts of a reconcile: claims several replicas cannot share, a lenient need."""

from __future__ import annotations

from typing import Any

import pytest
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import parse
from pagoda.operator.reconcile import claim_problems, last_need, most_replicas


def llms(**spec: Any) -> Any:
    body = {"metadata": {"name": "chat", "namespace": "ml"}, "spec": {"model": "m", **spec}}
    return parse(body, OperatorConfig())


def claim(*modes: str) -> dict[str, Any]:
    return {"metadata": {"name": "models"}, "spec": {"accessModes": list(modes)}}


@pytest.mark.parametrize(
    ("modes", "replicas", "reported"),
    [
        (("ReadWriteOnce",), 1, False),
        (("ReadWriteOnce",), 2, True),
        (("ReadWriteOncePod",), 2, True),
        (("ReadOnlyMany",), 4, False),
        (("ReadWriteMany",), 4, False),
        (("ReadWriteOnce", "ReadOnlyMany"), 4, False),  # the pods mount it read-only
        ((), 4, False),  # not bound yet: nothing known
    ],
)
def test_single_node_claims_with_several_replicas(
    modes: tuple[str, ...], replicas: int, reported: bool
) -> None:
    problems = claim_problems(llms(replicas=replicas), "spec.model", claim(*modes))
    assert bool(problems) == reported
    if reported:
        assert problems[0].reason == "SingleNodeVolume" and "models" in problems[0].message


def test_the_autoscalers_bound_counts_as_replicas() -> None:
    service = llms(replicas=1, autoscaling={"minReplicas": 1, "maxReplicas": 3})
    assert most_replicas(service) == 3
    assert claim_problems(service, "spec.model", claim("ReadWriteOnce"))


@pytest.mark.parametrize(
    ("spec", "need"),
    [
        ({}, 1),
        ({"replicas": 3, "minAvailable": 2}, 2),
        ({"replicas": 1, "minAvailable": 2}, 1),
        ({"replicas": "three", "minAvailable": True}, 1),
        ({"replicas": 0}, 1),
    ],
)
def test_the_need_of_a_spec_that_failed_validation(spec: dict[str, Any], need: int) -> None:
    assert last_need(spec) == need
