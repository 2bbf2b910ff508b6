"""What the controllers read from a pod, defined as Kubernetes' `podutil` defines it (pure)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

# The grace period the API server defaults `terminationGracePeriodSeconds` to.
DEFAULT_GRACE_SECONDS = 30


def parse_time(text: str | None) -> datetime.datetime | None:
    """An RFC 3339 timestamp as the API server writes it; None if absent or malformed."""
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def format_time(moment: datetime.datetime) -> str:
    """RFC 3339 UTC, seconds precision (metav1.Time)."""
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's Ready condition, if the kubelet wrote one."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Ready"), None)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True."""
    found = ready_condition(pod)
    return bool(found and found.get("status") == "True")


def pod_available(pod: Mapping[str, Any], min_ready_seconds: int, now: datetime.datetime) -> bool:
    """Ready for at least `min_ready_seconds` (podutil.IsPodAvailable)."""
    if not pod_ready(pod):
        return False
    if min_ready_seconds == 0:
        return True
    since = parse_time((ready_condition(pod) or {}).get("lastTransitionTime"))
    return since is not None and since + datetime.timedelta(seconds=min_ready_seconds) < now


def terminating(pod: Mapping[str, Any]) -> bool:
    """Deleted, and waiting for its kubelet to stop it (metadata.deletionTimestamp)."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def terminal(pod: Mapping[str, Any]) -> bool:
    """All its containers have stopped for good (phase Succeeded or Failed)."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def active(pod: Mapping[str, Any]) -> bool:
    """Counts as one of its controller's replicas (controller.FilterActivePods)."""
    return not terminating(pod) and not terminal(pod)


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the object's managing controller (the ownerReference with controller=true)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def controller_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference naming `owner` as the managing controller."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def restarts(pod: Mapping[str, Any]) -> int:
    """Restarts summed over the pod's containers."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount") or 0) for s in statuses)


_PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


def deletion_rank(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """Sort key: the pods a ReplicaSet should delete first sort first (controller.ActivePods).

    Unscheduled before scheduled, Pending before Unknown before Running, not
    ready before ready, ready for less time before longer, more restarts
    before fewer, newer before older.
    """
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ready = pod_ready(pod)
    ready_since = (ready_condition(pod) or {}).get("lastTransitionTime") or "" if ready else ""
    created = meta.get("creationTimestamp") or ""
    return (
        bool((pod.get("spec") or {}).get("nodeName")),
        _PHASE_RANK.get(status.get("phase", "Pending"), 0),
        ready,
        _descending(ready_since),
        -restarts(pod),
        _descending(created),
    )


def _descending(timestamp: str) -> tuple[int, ...]:
    # RFC 3339 strings of one format sort as their times; negate the code points
    # to sort later times first (an empty string, "no time", sorts first).
    return tuple(-ord(c) for c in timestamp) if timestamp else (-(1 << 20),)
