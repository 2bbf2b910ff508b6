"""Graceful deletion of pods, as kube-apiserver decides it (pure).

A DELETE of a pod does not remove it: the API server sets
`metadata.deletionTimestamp` (now + the grace period) and
`deletionGracePeriodSeconds`, and the pod's kubelet stops its containers
(preStop, SIGTERM, SIGKILL at the deadline), then deletes the pod again with
a grace period of 0, which removes it (once no finalizer is left). A pod that
no kubelet runs (unscheduled) or whose containers have all stopped goes at
once. A later DELETE may only shorten the grace period.

This is the generic registry's `BeforeDelete` with the pod strategy's
`CheckGracefulDelete`.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubesim.pods import DEFAULT_GRACE_SECONDS, format_time, parse_time, terminal

# (group, version, plural) of the resources whose strategy implements graceful deletion.
GRACEFUL_RESOURCES = {("", "v1", "pods")}


@dataclass(frozen=True, slots=True)
class Deletion:
    """What a DELETE does to the stored object.

    `obj` is the object to store (marked for deletion) or to answer with;
    `remove` says it goes now (when no finalizer holds it); `changed` says
    `obj` differs from what is stored.
    """

    obj: dict[str, Any]
    remove: bool
    changed: bool


def applies_to(resource: Any) -> bool:
    """Whether a DELETE of this (kmock) resource is graceful."""
    return (resource.group, resource.version, resource.plural) in GRACEFUL_RESOURCES


def requested_grace(params: Mapping[str, str], body: Any) -> int | None:
    """DeleteOptions.gracePeriodSeconds, from the body or the query; None if not given."""
    value = body.get("gracePeriodSeconds") if isinstance(body, Mapping) else None
    if value is None:
        value = params.get("gracePeriodSeconds")
    return None if value is None else int(value)


def delete_pod(pod: Mapping[str, Any], grace: int | None, now: datetime.datetime) -> Deletion:
    """The effect of a DELETE with `grace` (None: the pod's own) on a stored pod."""
    new = copy.deepcopy(dict(pod))
    meta = new.setdefault("metadata", {})
    marked, period = meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")
    if marked:
        if not period:
            return Deletion(new, remove=True, changed=False)
        if grace is None or grace >= period:
            return Deletion(new, remove=False, changed=False)  # graceful deletion is pending
        # Only a shorter grace period may replace a pending one.
        start = (parse_time(marked) or now) - datetime.timedelta(seconds=period)
        meta["deletionTimestamp"] = format_time(start + datetime.timedelta(seconds=grace))
        meta["deletionGracePeriodSeconds"] = grace
        return Deletion(new, remove=grace == 0, changed=True)
    if grace is None:
        grace = (new.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    if not (new.get("spec") or {}).get("nodeName") or terminal(new):
        grace = 0  # no kubelet has anything to stop
    grace = 1 if int(grace) < 0 else int(grace)
    meta["deletionTimestamp"] = format_time(now + datetime.timedelta(seconds=grace))
    meta["deletionGracePeriodSeconds"] = grace
    if meta.get("generation"):
        meta["generation"] += 1
    return Deletion(new, remove=grace == 0, changed=True)
