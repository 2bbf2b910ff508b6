"""Status and conditions from the applied children, the pods and the endpoints (pure)."""

from __future__ import annotations

import datetime
from typing import Any

from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import InvalidSpec, MissingReference, parse
from pagoda.operator.render.deployment import TEMPLATE_HASH_ANNOTATION
from pagoda.operator.status import (
    Observed,
    Problem,
    changes,
    compute,
    invalid,
    pod_problems,
    serving_endpoints,
    transitions,
)

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
LATER = NOW + datetime.timedelta(minutes=5)
HASH = "current"


def llms(**spec: Any) -> Any:
    body = {
        "metadata": {"name": "chat", "namespace": "ml", "generation": 4},
        "spec": {"model": "m", **spec},
    }
    return parse(body, OperatorConfig())


def deployment(replicas: int, ready: int, updated: int | None = None, **extra: Any) -> dict:
    status = {
        "observedGeneration": 2,
        "replicas": replicas,
        "readyReplicas": ready,
        "updatedReplicas": replicas if updated is None else updated,
        **extra,
    }
    return {"metadata": {"generation": 2}, "status": status}


def pod(name: str, ready: bool = True, template: str = HASH, **status: Any) -> dict:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "metadata": {"name": name, "annotations": {TEMPLATE_HASH_ANNOTATION: template}},
        "status": {"conditions": conditions, **status},
    }


def slices(ready: int, not_ready: int = 0) -> tuple[dict, ...]:
    endpoints = [
        {"addresses": [f"10.0.0.{i}"], "conditions": {"ready": i < ready}}
        for i in range(ready + not_ready)
    ]
    return ({"endpoints": endpoints},)


def observed(dep: Any, pods: tuple = (), endpoint_slices: tuple = (), **kw: Any) -> Observed:
    return Observed(dep, pods, endpoint_slices, template_hash=HASH, **kw)


def status_of(service: Any, obs: Observed, previous: Any = None, now: Any = NOW) -> dict:
    return compute(service, obs, "http://e/v1", "sel", previous or {}, now)


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def steady(replicas: int) -> Observed:
    pods = tuple(pod(f"p{i}") for i in range(replicas))
    return observed(deployment(replicas, replicas), pods, slices(replicas))


def test_all_serving_is_ready_and_complete() -> None:
    s = status_of(llms(replicas=2), steady(2))
    assert (s["replicas"], s["readyReplicas"], s["updatedReplicas"]) == (2, 2, 2)
    assert s["observedGeneration"] == 4 and s["endpoint"] == "http://e/v1"
    assert (cond(s, "Ready")["status"], cond(s, "Ready")["reason"]) == ("True", "Serving")
    assert cond(s, "Progressing")["reason"] == "RolloutComplete"
    assert cond(s, "Progressing")["message"] == "2 of 2 pods new and ready"
    assert cond(s, "Degraded")["status"] == "False"
    assert all(c["observedGeneration"] == 4 for c in s["conditions"])


def test_ready_needs_min_available_serving_endpoints() -> None:
    one_serving = observed(deployment(3, 1), (pod("a"),), slices(1, not_ready=2))
    assert cond(status_of(llms(replicas=3), one_serving), "Ready")["status"] == "True"
    strict = status_of(llms(replicas=3, minAvailable=2), one_serving)
    assert cond(strict, "Ready")["status"] == "False"
    assert cond(strict, "Ready")["reason"] == "EndpointsUnavailable"
    assert cond(strict, "Ready")["message"] == "1 serving endpoints, need 2"


def test_min_available_is_capped_at_the_replica_count() -> None:
    s = status_of(llms(replicas=1, minAvailable=3), steady(1))
    assert cond(s, "Ready")["status"] == "True"


def test_scaling_out_keeps_ready_and_reports_progress_quietly() -> None:
    before = status_of(llms(replicas=2), steady(2))
    loading = (pod("p0"), pod("p1"), pod("p2", ready=False), pod("p3", ready=False))
    after = status_of(
        llms(replicas=4), observed(deployment(4, 2), loading, slices(2, not_ready=2)), before
    )
    assert cond(after, "Ready")["status"] == "True"
    assert cond(after, "Ready")["lastTransitionTime"] == cond(before, "Ready")["lastTransitionTime"]
    progressing = cond(after, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "ScalingUp")
    assert progressing["message"] == "2 of 4 pods new and ready"
    assert all(kind == "Normal" for kind, _, _ in transitions(before, after))


def test_endpoints_not_ready_or_terminating_do_not_serve_and_addresses_count_once() -> None:
    endpoint_slices = (
        {"endpoints": [{"addresses": ["a"], "conditions": {"ready": True}}]},
        {"endpoints": [{"addresses": ["a"]}, {"addresses": ["b"], "conditions": {}}]},
        {"endpoints": [{"addresses": ["c"], "conditions": {"ready": False}}]},
        {"endpoints": [{"addresses": ["d"], "conditions": {"ready": True, "terminating": True}}]},
    )
    assert serving_endpoints(endpoint_slices) == 2  # a and b (unset ready means ready)


def test_scaled_to_zero() -> None:
    s = status_of(llms(replicas=0), observed(deployment(0, 0)))
    assert cond(s, "Ready")["reason"] == "ScaledToZero"
    assert cond(s, "Progressing")["reason"] == "RolloutComplete"


def test_a_rollout_counts_new_ready_pods_and_old_ones() -> None:
    pods = (pod("new-1"), pod("new-2", ready=False), pod("old-1", template="previous"))
    s = status_of(llms(replicas=2), observed(deployment(3, 2, updated=2), pods, slices(2)))
    progressing = cond(s, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut")
    assert progressing["message"] == "1 of 2 pods new and ready; 1 old pods still running"
    assert cond(s, "Ready")["status"] == "True"


def test_scaling_in_is_progress_too() -> None:
    pods = tuple(pod(f"p{i}") for i in range(3))
    s = status_of(llms(replicas=2), observed(deployment(3, 3), pods, slices(3)))
    assert cond(s, "Progressing")["reason"] == "ScalingDown"


def test_an_unobserved_deployment_generation_is_a_rollout() -> None:
    dep = deployment(1, 1)
    dep["metadata"]["generation"] = 3
    assert (
        cond(status_of(llms(), observed(dep, (pod("a"),), slices(1))), "Progressing")["reason"]
        == "RollingOut"
    )


def test_progress_deadline_is_degraded() -> None:
    conditions = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]
    s = status_of(llms(), observed(deployment(1, 0, conditions=conditions)))
    assert cond(s, "Progressing")["reason"] == "ProgressDeadlineExceeded"
    assert cond(s, "Degraded")["reason"] == "ProgressDeadlineExceeded"


def test_replica_failure_is_degraded() -> None:
    conditions = [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "quota"}
    ]
    s = status_of(llms(), observed(deployment(0, 0, conditions=conditions)))
    assert cond(s, "Degraded")["reason"] == "ReplicaFailure"
    assert "quota" in cond(s, "Degraded")["message"]


def test_failing_pods_are_named_with_their_reason() -> None:
    waiting = {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}
    pods = (pod("a", ready=False, containerStatuses=[waiting]), pod("c"))
    problems = pod_problems(pods, NOW, 300)
    assert [(p.reason, p.message.split(":")[0]) for p in problems] == [
        ("ImagePullBackOff", "pod a")
    ]
    s = status_of(llms(), observed(deployment(2, 1), pods, slices(1)))
    assert cond(s, "Degraded")["reason"] == "ImagePullBackOff"


def test_a_crash_loop_carries_the_runtimes_last_words() -> None:
    log_tail = (
        "INFO loading smollm2-135m-instruct\n"
        "pagoda: error: tensor_parallel_size 2 does not divide this model's "
        "9 attention heads and 3 key/value heads; choose a size that divides them\n"
    )
    crashing = {
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 2, "message": log_tail}},
    }
    (problem,) = pod_problems((pod("a", ready=False, containerStatuses=[crashing]),), NOW, 300)
    assert problem.reason == "CrashLoopBackOff"
    assert problem.message.startswith("pod a: last exit: Error (code 2): pagoda: error: ")
    assert "9 attention heads" in problem.message and "loading" not in problem.message


def test_unschedulable_is_degraded_only_past_the_grace_period() -> None:
    since = (NOW - datetime.timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes have GPUs",
        "lastTransitionTime": since,
    }
    pods = (pod("b", ready=False, conditions=[unschedulable]),)
    assert pod_problems(pods, NOW, unschedulable_grace=300) == []  # an autoscaler may add a node
    (problem,) = pod_problems(pods, NOW, unschedulable_grace=30)
    assert problem.reason == "Unschedulable" and "0/3 nodes have GPUs" in problem.message


def test_terminating_pods_are_ignored() -> None:
    p = pod("a", containerStatuses=[{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}])
    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_problems([p], NOW, 300) == []


def test_a_child_conflict_is_degraded_and_ready_while_the_pods_serve() -> None:
    problem = Problem("ChildConflict", "PodDisruptionBudget chat already exists and is not ...")
    s = status_of(llms(), observed(deployment(1, 1), (pod("a"),), slices(1), problems=(problem,)))
    assert (cond(s, "Ready")["status"], cond(s, "Ready")["reason"]) == ("True", "Serving")
    assert "PodDisruptionBudget chat" in cond(s, "Ready")["message"]
    assert (cond(s, "Degraded")["status"], cond(s, "Degraded")["reason"]) == (
        "True",
        "ChildConflict",
    )
    # Without serving endpoints the conflict is the reason readiness is missing.
    s = status_of(llms(), observed(deployment(1, 0), (), slices(0), problems=(problem,)))
    assert (cond(s, "Ready")["status"], cond(s, "Ready")["reason"]) == ("False", "ChildConflict")


def test_someone_elses_service_is_not_ready_whatever_its_endpoints() -> None:
    taken = Problem("ChildConflict", "Service chat already exists ...", blocks_serving=True)
    s = status_of(llms(), observed(deployment(1, 1), (pod("a"),), slices(1), problems=(taken,)))
    assert (cond(s, "Ready")["status"], cond(s, "Ready")["reason"]) == ("False", "ChildConflict")


def test_a_warning_is_degraded_only() -> None:
    warning = Problem("SingleNodeVolume", "spec.model: PersistentVolumeClaim 'm' is ...")
    s = status_of(llms(), observed(deployment(1, 1), (pod("a"),), slices(1), warnings=(warning,)))
    assert cond(s, "Ready")["status"] == "True" and cond(s, "Ready")["reason"] == "Serving"
    assert cond(s, "Degraded")["reason"] == "SingleNodeVolume"


def test_transition_time_moves_only_when_the_status_flips() -> None:
    waiting = observed(deployment(2, 0), (), slices(0))
    first = status_of(llms(replicas=2), waiting)
    again = status_of(llms(replicas=2), waiting, previous=first, now=LATER)
    assert cond(again, "Ready")["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert changes(first, again) == {}  # a steady object makes no status write
    flipped = status_of(llms(replicas=2), steady(2), previous=first, now=LATER)
    assert cond(flipped, "Ready")["lastTransitionTime"] == "2026-01-01T00:05:00Z"
    assert cond(flipped, "Degraded")["lastTransitionTime"] == "2026-01-01T00:00:00Z"
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


def test_an_invalid_edit_leaves_the_serving_pods_ready() -> None:
    # The last good spec's pods answer: no outage for `kubectl wait` or Argo CD.
    s = invalid(InvalidSpec("spec.engine.dtype", "bad"), 6, {}, NOW, serving=2, need=2)
    assert (cond(s, "Ready")["status"], cond(s, "Ready")["reason"]) == ("True", "Serving")
    assert "spec.engine.dtype" in cond(s, "Ready")["message"]
    assert cond(s, "Degraded")["status"] == "True"
    short = invalid(InvalidSpec("spec.engine.dtype", "bad"), 6, {}, NOW, serving=1, need=2)
    assert cond(short, "Ready")["status"] == "False"


def test_events_tell_each_cause_once_and_warn_on_trouble() -> None:
    s = invalid(InvalidSpec("spec.x", "bad"), 1, {}, NOW)
    assert transitions({}, s) == [("Warning", "InvalidSpec", "spec.x: bad")]
    assert transitions(s, s) == []


def test_losing_readiness_warns_but_not_having_it_yet_does_not() -> None:
    loading = status_of(llms(), observed(deployment(1, 0), (), slices(0)))
    assert all(kind == "Normal" for kind, _, _ in transitions({}, loading))
    ready = status_of(llms(), steady(1), previous=loading)
    assert ("Normal", "Serving", "1 serving endpoints (need 1)") in transitions(loading, ready)
    lost = status_of(llms(), observed(deployment(1, 0), (pod("a", ready=False),), slices(0)), ready)
    assert ("Warning", "EndpointsUnavailable") in [(k, r) for k, r, _ in transitions(ready, lost)]
