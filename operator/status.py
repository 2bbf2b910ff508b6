"""The status of an LLMService, computed from what the cluster says (pure).

Three conditions, defined the way Deployments and KServe define theirs:

* `Ready`: the Service has at least `minAvailable` serving endpoints (capped
  at `replicas`). Readiness is about whether the endpoint answers, so scaling
  out, which only adds capacity, never lowers it, and neither does a spec
  that cannot be applied (an invalid edit, a missing Secret, a refused
  write): the pods already running keep serving, and `kubectl wait`, Argo CD
  and Flux must not report an outage that is not one. Those go to Degraded.
* `Progressing`: a rollout or a scale is under way; the message says how many
  pods run the current spec and are ready.
* `Degraded`: a fault that needs a person: a crash loop, an image that cannot
  be pulled, a pod unschedulable past a grace period, a child whose name is
  taken (ChildConflict), a spec the operator or the API server refuses, a
  ReadWriteOnce claim shared by several replicas.
* `ModelReady` (hf:// models): the pods' download init containers, as
  Kubernetes' own `Initialized` reports init containers, with the bytes each
  downloading pod reports on GET /progress.

Each condition keeps its lastTransitionTime until its status really flips, so
a steady object makes no status writes at all.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.operator.llmservice import InvalidSpec, LLMService
from pagoda.operator.model_download import PodDownload, Progress, pod_downloads
from pagoda.operator.render.deployment import TEMPLATE_HASH_ANNOTATION
from pagoda.operator.render.model_download import downloads_model

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
class Problem:
    """One reason the service is degraded.

    `blocks_serving`: the endpoint cannot be ours whatever the pods do (the
    Service's name is taken by someone else's Service).
    """

    reason: str
    message: str
    blocks_serving: bool = False


@dataclass(frozen=True, slots=True)
class Observed:
    """The facts a status is computed from."""

    deployment: Mapping[str, Any] | None
    pods: tuple[Mapping[str, Any], ...] = ()
    endpoint_slices: tuple[Mapping[str, Any], ...] = ()
    # The pod-template hash of the spec just applied: pods carrying it are new.
    template_hash: str | None = None
    # What kept parts of the spec from being applied (conflicts, refused writes).
    problems: tuple[Problem, ...] = ()
    # Faults found in what the spec refers to, that do not stop the rollout.
    warnings: tuple[Problem, ...] = ()
    # What each downloading pod said on GET /progress, by pod name.
    download_progress: Mapping[str, Progress] | None = None


def timestamp(now: datetime.datetime) -> str:
    """RFC 3339 UTC, seconds precision, as conditions carry it."""
    return now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def condition(
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime.datetime,
    previous: Iterable[Mapping[str, Any]],
    generation: int | None,
) -> dict[str, Any]:
    """A condition; its lastTransitionTime moves only when its status flips."""
    value = "True" if status else "False"
    since = timestamp(now)
    for old in previous:
        if old.get("type") == kind and old.get("status") == value:
            since = old.get("lastTransitionTime") or since
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


def serving_endpoints(slices: Iterable[Mapping[str, Any]]) -> int:
    """Distinct addresses the Service routes to (EndpointSlice conditions.ready).

    An unset `ready` means unknown, which consumers treat as ready; a
    terminating endpoint is on its way out and is not counted.
    """
    addresses: set[str] = set()
    for endpoint_slice in slices:
        for endpoint in endpoint_slice.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            if conditions.get("ready") is False or conditions.get("terminating"):
                continue
            addresses.update(endpoint.get("addresses") or [])
    return len(addresses)


def _terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition, as the kubelet reports it."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def last_words(message: str, limit: int = 300) -> str:
    """The last line a container wrote before it exited (its termination message).

    With `terminationMessagePolicy: FallbackToLogsOnError` the kubelet keeps
    the end of a failed container's log; the runtime's refusal (a flag it
    rejects, a tensor-parallel size the model's heads do not divide) is its
    last line.
    """
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return last if len(last) <= limit else "..." + last[-limit:]


def pod_problems(
    pods: Iterable[Mapping[str, Any]], now: datetime.datetime, unschedulable_grace: float
) -> list[Problem]:
    """Pods failing in a way a rollout will not cure, one Problem per cause."""
    problems = []
    for pod in pods:
        if _terminating(pod):
            continue  # a terminating pod's troubles are over
        name = (pod.get("metadata") or {}).get("name", "?")
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                since = _parse_time(cond.get("lastTransitionTime")) or now
                waited = (now - since).total_seconds()
                if waited >= unschedulable_grace:
                    message = (
                        f"pod {name}: unschedulable for {int(waited)}s: {cond.get('message', '')}"
                    )
                    problems.append(Problem("Unschedulable", message))
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            last = (cs.get("lastState") or {}).get("terminated") or {}
            if waiting.get("reason") in FAILING_WAITING:
                detail = waiting.get("message") or ""
                if last.get("reason"):  # e.g. OOMKilled behind a CrashLoopBackOff
                    said = last_words(last.get("message") or "")
                    said = f": {said}" if said else ""
                    detail = (
                        f"last exit: {last['reason']} (code {last.get('exitCode')}){said} {detail}"
                    )
                problems.append(Problem(waiting["reason"], f"pod {name}: {detail}".strip()))
    return problems


def deployment_problems(deployment: Mapping[str, Any]) -> list[Problem]:
    """The Deployment controller's own verdicts: a stuck rollout, failed pod creation."""
    problems = []
    for cond in (deployment.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            problems.append(Problem("ProgressDeadlineExceeded", cond.get("message", "")))
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            problems.append(Problem("ReplicaFailure", cond.get("message", "")))
    return problems


def progress(llms: LLMService, observed: Observed) -> tuple[bool, str, str]:
    """(under way, reason, message) of the Progressing condition."""
    dep = observed.deployment or {}
    desired = llms.spec.replicas
    generation = (dep.get("metadata") or {}).get("generation")
    seen = (dep.get("status") or {}).get("observedGeneration")
    if generation is not None and (seen is None or seen < generation):
        return True, "RollingOut", "waiting for the Deployment controller to see the new spec"
    live = [p for p in observed.pods if not _terminating(p)]
    new = [
        p
        for p in live
        if ((p.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)
        == observed.template_hash
    ]
    old = len(live) - len(new)
    new_ready = sum(1 for p in new if pod_ready(p))
    summary = f"{new_ready} of {desired} pods new and ready"
    if old:
        return True, "RollingOut", f"{summary}; {old} old pods still running"
    if new_ready < desired:
        return True, "ScalingUp", summary
    if len(new) > desired:
        return True, "ScalingDown", f"{summary}; {len(new) - desired} pods to remove"
    return False, "RolloutComplete", summary


def compute(
    llms: LLMService,
    observed: Observed,
    endpoint: str,
    selector: str,
    previous: Mapping[str, Any],
    now: datetime.datetime,
    unschedulable_grace: float = 300.0,
    scaling: tuple[bool, str, str] | None = None,
    adapters: tuple[bool | None, str, str] | None = None,
) -> dict[str, Any]:
    """The full status from the applied children, the pods and the endpoints.

    `scaling` is the built-in autoscaler's health (active, reason, message),
    None when it does not run: it becomes the `ScalingActive` condition.
    `adapters` is the adapter loop's (ready or None for unknown, reason,
    message), None without LoRA: it becomes `AdaptersReady`.
    """
    gen = llms.generation
    old = previous.get("conditions") or []
    dep = observed.deployment or {}
    dep_status = dep.get("status") or {}
    desired = llms.spec.replicas

    blocking = observed.problems
    serving = serving_endpoints(observed.endpoint_slices)
    need = min(llms.spec.min_available, desired)
    ready = readiness(serving, need, desired, blocking, now, old, gen)

    problems = [
        *blocking,
        *observed.warnings,
        *deployment_problems(dep),
        *pod_problems(observed.pods, now, unschedulable_grace),
        *download_problems(llms, observed),
    ]
    under_way, reason, message = progress(llms, observed)
    if any(p.reason == "ProgressDeadlineExceeded" for p in problems):
        prog = condition("Progressing", False, "ProgressDeadlineExceeded", message, now, old, gen)
    elif observed.deployment is None and blocking:
        prog = condition(
            "Progressing", False, blocking[0].reason, blocking[0].message, now, old, gen
        )
    else:
        prog = condition("Progressing", under_way, reason, message, now, old, gen)

    if problems:
        message = "; ".join(p.message for p in problems[:5])
        degraded = condition("Degraded", True, problems[0].reason, message, now, old, gen)
    else:
        degraded = condition("Degraded", False, "AsExpected", "", now, old, gen)

    return {
        "observedGeneration": gen,
        "replicas": dep_status.get("replicas") or 0,
        "readyReplicas": dep_status.get("readyReplicas") or 0,
        "updatedReplicas": dep_status.get("updatedReplicas") or 0,
        "selector": selector,
        "endpoint": endpoint,
        "conditions": [
            ready,
            prog,
            degraded,
            *scaling_condition(scaling, now, old, gen),
            *adapters_condition(adapters, now, old, gen),
            *model_ready_condition(llms, observed, now, old, gen),
        ],
    }


def readiness(
    serving: int,
    need: int,
    desired: int,
    problems: tuple[Problem, ...],
    now: datetime.datetime,
    previous: Iterable[Mapping[str, Any]],
    generation: int | None,
) -> dict[str, Any]:
    """The Ready condition: enough serving endpoints, whether or not the spec applied.

    `problems` (what kept the spec from being applied) only explain a lack of
    endpoints; they never take readiness from pods that serve, unless the
    endpoint itself is not ours.
    """
    applied = "; ".join(p.message for p in problems[:3])
    unapplied = f"; the spec is not fully applied: {applied}" if problems else ""
    taken = next((p for p in problems if p.blocks_serving), None)
    if desired == 0:
        return condition("Ready", False, "ScaledToZero", "replicas is 0", now, previous, generation)
    if taken is not None:
        return condition("Ready", False, taken.reason, taken.message, now, previous, generation)
    if serving >= need:
        message = f"{serving} serving endpoints (need {need}){unapplied}"
        return condition("Ready", True, "Serving", message, now, previous, generation)
    reason = problems[0].reason if problems else "EndpointsUnavailable"
    message = f"{serving} serving endpoints, need {need}{unapplied}"
    return condition("Ready", False, reason, message, now, previous, generation)


def adapters_condition(
    adapters: tuple[bool | None, str, str] | None,
    now: datetime.datetime,
    previous: Iterable[Mapping[str, Any]],
    generation: int | None,
) -> list[dict[str, Any]]:
    """`AdaptersReady`: every ready pod serves every adapter of the spec."""
    if adapters is None:
        return []
    ready, reason, message = adapters
    out = condition("AdaptersReady", bool(ready), reason, message, now, previous, generation)
    if ready is None:
        # Unknown until a pod can be asked; its transition time moves as any flip's.
        out["status"] = "Unknown"
        for old in previous:
            if old.get("type") == "AdaptersReady" and old.get("status") == "Unknown":
                out["lastTransitionTime"] = (
                    old.get("lastTransitionTime") or out["lastTransitionTime"]
                )
    return [out]


def _current_downloads(llms: LLMService, observed: Observed) -> list[PodDownload]:
    """The downloads of the pods that run the current spec (an old pod's model is not news)."""
    if not downloads_model(llms):
        return []
    pods = [
        p
        for p in observed.pods
        if observed.template_hash is None
        or ((p.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)
        == observed.template_hash
    ]
    return pod_downloads(pods)


def download_problems(llms: LLMService, observed: Observed) -> list[Problem]:
    """A failed download needs a person (a token, a revision, a bigger volume): Degraded."""
    return [
        Problem("DownloadFailed", f"pod {d.pod}: model download failed: {last_words(d.message)}")
        for d in _current_downloads(llms, observed)
        if d.state == "Failed"
    ]


def _size(n: int) -> str:
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.1f} GiB"


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def model_ready_condition(
    llms: LLMService,
    observed: Observed,
    now: datetime.datetime,
    previous: Iterable[Mapping[str, Any]],
    generation: int | None,
) -> list[dict[str, Any]]:
    """`ModelReady` of an hf:// model: every pod of the current spec has it in its cache.

    False while a pod downloads (with the bytes the downloading pods report,
    e.g. "3.1 of 14.9 GiB (21%) on 2 pods") or after a download failed (the
    init container's termination message); Unknown before any pod started.
    """
    if not downloads_model(llms):
        return []
    downloads = _current_downloads(llms, observed)
    failed = [d for d in downloads if d.state == "Failed"]
    running = [d for d in downloads if d.state == "Downloading"]
    done = [d for d in downloads if d.state == "Done"]
    model = llms.spec.model
    if failed:
        first = failed[0]
        message = f"{model}: pod {first.pod}: {last_words(first.message)}"
        if len(failed) > 1:
            message += f" (and {len(failed) - 1} more pods)"
        return [
            condition("ModelReady", False, "DownloadFailed", message, now, previous, generation)
        ]
    if running:
        read = [p for d in running if (p := (observed.download_progress or {}).get(d.pod))]
        total = sum(p.bytes_total for p in read)
        if total:
            got = sum(p.bytes_done for p in read)
            message = (
                f"{model}: {_size(got)} of {_size(total)} ({100 * got // total}%) "
                f"on {_pods(len(running))}"
            )
        else:
            message = f"{model}: downloading on {_pods(len(running))}"
        return [condition("ModelReady", False, "Downloading", message, now, previous, generation)]
    if done:
        # Pods not started yet are not news: a scale-out does not unready the model.
        message = f"{model} is in the cache of {_pods(len(done))}"
        return [condition("ModelReady", True, "Downloaded", message, now, previous, generation)]
    out = condition(
        "ModelReady",
        False,
        "Pending",
        f"{model}: no download under way yet",
        now,
        previous,
        generation,
    )
    out["status"] = "Unknown"
    for old in previous:
        if old.get("type") == "ModelReady" and old.get("status") == "Unknown":
            out["lastTransitionTime"] = old.get("lastTransitionTime") or out["lastTransitionTime"]
    return [out]


def scaling_condition(
    scaling: tuple[bool, str, str] | None,
    now: datetime.datetime,
    previous: Iterable[Mapping[str, Any]],
    generation: int | None,
) -> list[dict[str, Any]]:
    """`ScalingActive` (as HPA names it): whether the autoscaler has metrics to act on."""
    if scaling is None:
        return []
    active, reason, message = scaling
    return [condition("ScalingActive", active, reason, message, now, previous, generation)]


def invalid(
    problem: InvalidSpec,
    generation: int | None,
    previous: Mapping[str, Any],
    now: datetime.datetime,
    serving: int = 0,
    need: int = 1,
) -> dict[str, Any]:
    """The status of a spec the operator refuses to act on; children are left as they are.

    The pods of the last good spec keep serving: `serving` of the Service's
    endpoints answer, against the `need` of the last spec's minAvailable.
    """
    old = previous.get("conditions") or []
    message = str(problem)
    reason = problem.reason
    refused = (Problem(reason, message),)
    return {
        "observedGeneration": generation,
        "conditions": [
            readiness(serving, need, max(need, 1), refused, now, old, generation),
            condition("Progressing", False, reason, message, now, old, generation),
            condition("Degraded", True, reason, message, now, old, generation),
        ],
    }


# The status fields the sync loop writes (`compute`); the autoscaler and the
# adapter loop write `autoscaling` and `adapters` under managers of their own.
OWNED_FIELDS = (
    "observedGeneration",
    "replicas",
    "readyReplicas",
    "updatedReplicas",
    "selector",
    "endpoint",
    "conditions",
)


def owned(status: Mapping[str, Any]) -> dict[str, Any]:
    """The sync loop's part of a status."""
    return {key: status[key] for key in OWNED_FIELDS if key in status}


def changes(previous: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of `new` whose values differ from `previous` (a minimal status patch)."""
    return {key: value for key, value in new.items() if previous.get(key) != value}


def transitions(previous: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Events worth telling a user: (type, reason, message) for each condition that moved."""
    old = {c.get("type"): c for c in previous.get("conditions") or []}
    events = []
    for cond in new.get("conditions", []):
        if cond["type"] == "AdaptersReady":
            continue  # the adapter loop posts its own Events, pod by pod
        before = old.get(cond["type"], {})
        moved = (before.get("status"), before.get("reason")) != (cond["status"], cond["reason"])
        if not moved:
            continue
        if cond["type"] == "Degraded":
            bad = cond["status"] == "True"
        elif cond["type"] == "Ready":
            # Losing readiness is news; not having it yet (pods loading) is not.
            bad = cond["status"] == "False" and before.get("status") == "True"
        elif cond["type"] == "ScalingActive":
            bad = cond["status"] == "False"
        elif cond["type"] == "ModelReady":
            bad = cond["reason"] == "DownloadFailed"
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
