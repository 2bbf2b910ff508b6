"""The status of an LLMService, computed from what the cluster says (pure).

Conditions follow the Kubernetes API conventions: `Ready` (the endpoint serves
at the promised capacity), `Progressing` (a rollout is under way) and
`Degraded` (something needs a human). Each keeps its lastTransitionTime until
its status really flips, so a steady object makes no status writes at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.operator.llmservice import InvalidSpec, LLMService

# Waiting reasons of a container that will not fix themselves.
FAILING_WAITING = {
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}


@dataclass(frozen=True, slots=True)
class Observed:
    """The facts a status is computed from."""

    deployment: Mapping[str, Any] | None
    pods: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason the service is degraded."""

    reason: str
    message: str


def condition(
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    previous: Iterable[Mapping[str, Any]],
    generation: int | None,
) -> dict[str, Any]:
    """A condition; its lastTransitionTime moves only when its status flips."""
    value = "True" if status else "False"
    since = now
    for old in previous:
        if old.get("type") == kind and old.get("status") == value:
            since = old.get("lastTransitionTime") or now
    out = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def pod_problems(pods: Iterable[Mapping[str, Any]]) -> list[Problem]:
    """Pods that are failing in a way a rollout will not cure, one Problem per pod."""
    problems = []
    for pod in pods:
        name = pod.get("metadata", {}).get("name", "?")
        status = pod.get("status", {})
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue  # a terminating pod's troubles are over
        for cond in status.get("conditions", []):
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                problems.append(Problem("Unschedulable", f"pod {name}: {cond.get('message', '')}"))
        for cs in status.get("containerStatuses", []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            last = (cs.get("lastState") or {}).get("terminated") or {}
            if waiting.get("reason") in FAILING_WAITING:
                detail = waiting.get("message") or ""
                if last.get("reason"):  # e.g. OOMKilled behind a CrashLoopBackOff
                    detail = f"last exit: {last['reason']} (code {last.get('exitCode')}) {detail}"
                problems.append(Problem(waiting["reason"], f"pod {name}: {detail}".strip()))
    return problems


def _deployment_problems(deployment: Mapping[str, Any]) -> list[Problem]:
    problems = []
    for cond in deployment.get("status", {}).get("conditions", []):
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            problems.append(Problem("ProgressDeadlineExceeded", cond.get("message", "")))
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            problems.append(Problem("ReplicaFailure", cond.get("message", "")))
    return problems


def _resolve(value: int | str, total: int, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    share = total * int(value.rstrip("%")) / 100
    return math.ceil(share) if round_up else math.floor(share)


def min_ready(llms: LLMService) -> int:
    """Ready pods needed to count as Ready: as a Deployment's `Available`."""
    replicas = llms.spec.replicas
    unavailable = _resolve(llms.spec.rollout.max_unavailable, replicas, round_up=False)
    return max(1, replicas - unavailable)


def _rolling(llms: LLMService, deployment: Mapping[str, Any]) -> tuple[bool, str]:
    status = deployment.get("status", {})
    generation = deployment.get("metadata", {}).get("generation")
    observed = status.get("observedGeneration")
    desired = llms.spec.replicas
    updated = status.get("updatedReplicas") or 0
    total = status.get("replicas") or 0
    ready = status.get("readyReplicas") or 0
    if generation is not None and (observed is None or observed < generation):
        return True, "the Deployment controller has not observed the new spec yet"
    if updated < desired:
        return True, f"{updated} of {desired} pods updated"
    if total > updated:
        return True, f"{total - updated} old pods terminating"
    if ready < desired:
        return True, f"{ready} of {desired} pods ready"
    return False, f"{desired} of {desired} pods updated and ready"


def compute(
    llms: LLMService,
    observed: Observed,
    endpoint: str,
    selector: str,
    previous: Mapping[str, Any],
    now: str,
) -> dict[str, Any]:
    """The full status from the live Deployment and pods."""
    gen = llms.generation
    old = previous.get("conditions") or []
    dep = observed.deployment or {}
    dep_status = dep.get("status", {})
    ready = dep_status.get("readyReplicas") or 0
    desired = llms.spec.replicas

    problems = _deployment_problems(dep) + pod_problems(observed.pods)
    rolling, progress = _rolling(llms, dep)
    deadline = any(p.reason == "ProgressDeadlineExceeded" for p in problems)

    if desired == 0:
        ready_cond = condition("Ready", False, "ScaledToZero", "replicas is 0", now, old, gen)
    elif ready >= min_ready(llms):
        msg = f"{ready} of {desired} pods ready"
        ready_cond = condition("Ready", True, "MinimumReplicasReady", msg, now, old, gen)
    else:
        msg = f"{ready} of {desired} pods ready (need {min_ready(llms)})"
        ready_cond = condition("Ready", False, "MinimumReplicasUnavailable", msg, now, old, gen)

    if deadline:
        prog = condition("Progressing", False, "ProgressDeadlineExceeded", progress, now, old, gen)
    elif rolling:
        prog = condition("Progressing", True, "RollingOut", progress, now, old, gen)
    else:
        prog = condition("Progressing", False, "RolloutComplete", progress, now, old, gen)

    if problems:
        message = "; ".join(p.message for p in problems[:5])
        degraded = condition("Degraded", True, problems[0].reason, message, now, old, gen)
    else:
        degraded = condition("Degraded", False, "AsExpected", "", now, old, gen)

    return {
        "observedGeneration": gen,
        "replicas": dep_status.get("replicas") or 0,
        "readyReplicas": ready,
        "updatedReplicas": dep_status.get("updatedReplicas") or 0,
        "selector": selector,
        "endpoint": endpoint,
        "conditions": [ready_cond, prog, degraded],
    }


def invalid(
    problem: InvalidSpec, generation: int | None, previous: Mapping[str, Any], now: str
) -> dict[str, Any]:
    """The status of a spec the operator refuses to act on; children are left as they are."""
    old = previous.get("conditions") or []
    message = str(problem)
    reason = problem.reason
    return {
        "observedGeneration": generation,
        "conditions": [
            condition("Ready", False, reason, message, now, old, generation),
            condition("Progressing", False, reason, message, now, old, generation),
            condition("Degraded", True, reason, message, now, old, generation),
        ],
    }


def changes(previous: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of `new` whose values differ from `previous` (a minimal status patch)."""
    return {key: value for key, value in new.items() if previous.get(key) != value}


def transitions(previous: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Events worth telling a user: (type, reason, message) for each condition that moved."""
    old = {c.get("type"): c for c in previous.get("conditions") or []}
    events = []
    for cond in new.get("conditions", []):
        before = old.get(cond["type"], {})
        moved = (before.get("status"), before.get("reason")) != (cond["status"], cond["reason"])
        if not moved:
            continue
        if cond["type"] == "Degraded":
            bad = cond["status"] == "True"
        elif cond["type"] == "Ready":
            # Losing readiness is news; not having it yet (pods loading) is not.
            bad = cond["status"] == "False" and before.get("status") == "True"
        else:
            bad = cond["reason"] == "ProgressDeadlineExceeded"
        kind = "Warning" if bad else "Normal"
        message = cond["message"] or f"{cond['type']} is {cond['status']}"
        events.append((kind, cond["reason"], message))
    # One cause often moves several conditions (an invalid spec moves all three):
    # tell it once, by its most severe event.
    events.sort(key=lambda event: event[0] != "Warning")
    unique: dict[str, tuple[str, str, str]] = {}
    for event in events:
        unique.setdefault(event[1], event)
    return list(unique.values())
