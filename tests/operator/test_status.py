"""Status and conditions from the live Deployment and pods (pure)."""

from __future__ import annotations

from typing import Any

from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import InvalidSpec, MissingReference, parse
from pagoda.operator.status import Observed, changes, compute, invalid, pod_problems, transitions

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:05:00Z"


def llms(**spec: Any) -> Any:
    body = {
        "metadata": {"name": "chat", "namespace": "ml", "generation": 4},
        "spec": {"model": "m", **spec},
    }
    return parse(body, OperatorConfig())


def deployment(
    replicas: int, ready: int, updated: int | None = None, **extra: Any
) -> dict[str, Any]:
    status = {
        "observedGeneration": 2,
        "replicas": replicas,
        "readyReplicas": ready,
        "updatedReplicas": replicas if updated is None else updated,
        **extra,
    }
    return {"metadata": {"generation": 2}, "status": status}


def status_of(
    service: Any, dep: Any, pods: tuple = (), previous: Any = None, now: str = NOW
) -> dict:
    return compute(service, Observed(dep, pods), "http://e/v1", "sel", previous or {}, now)


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_all_ready_is_ready_and_complete() -> None:
    s = status_of(llms(replicas=2), deployment(2, 2))
    assert (s["replicas"], s["readyReplicas"], s["updatedReplicas"]) == (2, 2, 2)
    assert s["observedGeneration"] == 4 and s["endpoint"] == "http://e/v1"
    assert cond(s, "Ready")["status"] == "True"
    assert cond(s, "Ready")["reason"] == "MinimumReplicasReady"
    assert cond(s, "Progressing")["reason"] == "RolloutComplete"
    assert cond(s, "Degraded")["status"] == "False"
    assert all(c["observedGeneration"] == 4 for c in s["conditions"])


def test_missing_ready_pods_are_not_ready() -> None:
    s = status_of(llms(replicas=3), deployment(3, 2))
    assert cond(s, "Ready")["status"] == "False"
    assert cond(s, "Ready")["message"] == "2 of 3 pods ready (need 3)"
    assert cond(s, "Progressing")["status"] == "True"


def test_max_unavailable_lowers_the_bar_like_a_deployment() -> None:
    s = status_of(
        llms(replicas=4, rollout={"maxSurge": 0, "maxUnavailable": "25%"}), deployment(4, 3)
    )
    assert cond(s, "Ready")["status"] == "True"


def test_scaled_to_zero() -> None:
    s = status_of(llms(replicas=0), deployment(0, 0))
    assert cond(s, "Ready")["reason"] == "ScaledToZero"


def test_rollout_in_progress_while_old_pods_remain() -> None:
    s = status_of(llms(replicas=2), deployment(3, 3, updated=2))
    assert cond(s, "Progressing")["status"] == "True"
    assert "old pods" in cond(s, "Progressing")["message"]


def test_unobserved_deployment_generation_is_progressing() -> None:
    dep = deployment(1, 1)
    dep["metadata"]["generation"] = 3
    assert cond(status_of(llms(), dep), "Progressing")["status"] == "True"


def test_progress_deadline_is_degraded() -> None:
    conditions = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": "slow",
        }
    ]
    s = status_of(llms(), deployment(1, 0, conditions=conditions))
    assert cond(s, "Progressing")["reason"] == "ProgressDeadlineExceeded"
    assert cond(s, "Degraded")["status"] == "True"
    assert cond(s, "Degraded")["reason"] == "ProgressDeadlineExceeded"


def test_replica_failure_is_degraded() -> None:
    conditions = [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "quota"}
    ]
    s = status_of(llms(), deployment(0, 0, conditions=conditions))
    assert (
        cond(s, "Degraded")["reason"] == "ReplicaFailure"
        and "quota" in cond(s, "Degraded")["message"]
    )


def pod(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": status}


def test_failing_pods_are_named_with_their_reason() -> None:
    pods = (
        pod(
            "a",
            containerStatuses=[
                {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}
            ],
        ),
        pod(
            "b",
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes have GPUs",
                }
            ],
        ),
        pod("c", containerStatuses=[{"state": {"running": {}}}]),
    )
    problems = pod_problems(pods)
    assert [(p.reason, p.message.split(":")[0]) for p in problems] == [
        ("ImagePullBackOff", "pod a"),
        ("Unschedulable", "pod b"),
    ]
    s = status_of(llms(), deployment(2, 0), pods)
    assert cond(s, "Degraded")["reason"] == "ImagePullBackOff"
    assert "0/3 nodes have GPUs" in cond(s, "Degraded")["message"]


def test_terminating_pods_are_ignored() -> None:
    p = pod("a", containerStatuses=[{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}])
    p["metadata"]["deletionTimestamp"] = NOW
    assert pod_problems([p]) == []


def test_transition_time_moves_only_when_the_status_flips() -> None:
    first = status_of(llms(replicas=2), deployment(2, 1))
    again = status_of(llms(replicas=2), deployment(2, 1), previous=first, now=LATER)
    assert cond(again, "Ready")["lastTransitionTime"] == NOW
    assert changes(first, again) == {}  # a steady object makes no status write
    flipped = status_of(llms(replicas=2), deployment(2, 2), previous=first, now=LATER)
    assert cond(flipped, "Ready")["lastTransitionTime"] == LATER
    assert cond(flipped, "Degraded")["lastTransitionTime"] == NOW
    assert set(changes(first, flipped)) == {"readyReplicas", "conditions"}


def test_invalid_spec_names_the_field_in_every_condition() -> None:
    s = invalid(InvalidSpec("spec.engine.dtype", "bad"), 5, {}, NOW)
    assert s["observedGeneration"] == 5
    assert {c["type"]: (c["status"], c["reason"]) for c in s["conditions"]} == {
        "Ready": ("False", "InvalidSpec"),
        "Progressing": ("False", "InvalidSpec"),
        "Degraded": ("True", "InvalidSpec"),
    }
    assert "spec.engine.dtype" in cond(s, "Degraded")["message"]
    missing = invalid(MissingReference("spec.apiKeySecretRef.name", "gone"), 5, {}, NOW)
    assert cond(missing, "Degraded")["reason"] == "MissingReference"


def test_events_tell_each_cause_once_and_warn_on_trouble() -> None:
    s = invalid(InvalidSpec("spec.x", "bad"), 1, {}, NOW)
    assert transitions({}, s) == [("Warning", "InvalidSpec", "spec.x: bad")]
    assert transitions(s, s) == []


def test_losing_readiness_warns_but_not_having_it_yet_does_not() -> None:
    loading = status_of(llms(), deployment(1, 0))
    assert all(kind == "Normal" for kind, _, _ in transitions({}, loading))
    ready = status_of(llms(), deployment(1, 1), previous=loading)
    assert ("Normal", "MinimumReplicasReady", "1 of 1 pods ready") in transitions(loading, ready)
    lost = status_of(llms(), deployment(1, 0), previous=ready)
    assert ("Warning", "MinimumReplicasUnavailable") in [
        (k, r) for k, r, _ in transitions(ready, lost)
    ]
