"""The Deployment controller's decisions, as kube-controller-manager makes them (pure).

Names follow pkg/controller/deployment (and its util package) so that a reader
of one can read the other: `new_replica_set_replicas` is `NewRSNewReplicas`,
`old_scale_down` is `reconcileOldReplicaSets`, `proportional_scale` is
`scale`, `rollout_status` is `syncRolloutStatus`. Objects are the API's
dicts; the Deployment's defaults (1 replica, RollingUpdate 25%/25%, 10
revisions kept, a 600 s progress deadline) are read here, since the
simulated API server does not write them.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubesim.pods import format_time, parse_time

TEMPLATE_HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
# The Deployment's annotations that its ReplicaSets do not inherit.
_NOT_COPIED = {
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    "deployment.kubernetes.io/revision-history",
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    "deprecated.deployment.rollback.to",
}
# Condition reasons (deploymentutil).
NEW_RS_CREATED = "NewReplicaSetCreated"
FOUND_NEW_RS = "FoundNewReplicaSet"
RS_UPDATED = "ReplicaSetUpdated"
NEW_RS_AVAILABLE = "NewReplicaSetAvailable"
TIMED_OUT = "ProgressDeadlineExceeded"
MIN_AVAILABLE = "MinimumReplicasAvailable"
MIN_UNAVAILABLE = "MinimumReplicasUnavailable"

RS = dict[str, Any]

# ------------------------------------------------------------------ reading


def replicas(obj: Mapping[str, Any]) -> int:
    """spec.replicas of a Deployment or ReplicaSet (defaulted to 1)."""
    value = (obj.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


def _status(obj: Mapping[str, Any], key: str) -> int:
    return int((obj.get("status") or {}).get(key) or 0)


def available(rs: Mapping[str, Any] | None) -> int:
    """status.availableReplicas."""
    return _status(rs, "availableReplicas") if rs else 0


def revision(rs: Mapping[str, Any]) -> int:
    """The revision annotation of a ReplicaSet (0 if none)."""
    try:
        return int(((rs.get("metadata") or {}).get("annotations") or {}).get(REVISION, 0))
    except ValueError:
        return 0


def _annotation_int(rs: Mapping[str, Any], key: str) -> int | None:
    try:
        return int(((rs.get("metadata") or {}).get("annotations") or {})[key])
    except (KeyError, ValueError):
        return None


def is_rolling(deployment: Mapping[str, Any]) -> bool:
    """Whether the strategy is RollingUpdate (the default)."""
    strategy = (deployment.get("spec") or {}).get("strategy") or {}
    return strategy.get("type", "RollingUpdate") == "RollingUpdate"


def scaled_value(value: int | str, total: int, round_up: bool) -> int:
    """An IntOrString as a count: `25%` of `total`, rounded up or down."""
    if isinstance(value, int):
        return value
    text = str(value)
    if not text.endswith("%"):
        return int(text)
    share = total * int(text[:-1]) / 100
    return math.ceil(share) if round_up else math.floor(share)


def fenceposts(deployment: Mapping[str, Any]) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) as counts: surge rounds up, unavailable down; never both 0."""
    rolling = ((deployment.get("spec") or {}).get("strategy") or {}).get("rollingUpdate") or {}
    wanted = replicas(deployment)
    surge = scaled_value(rolling.get("maxSurge", "25%"), wanted, round_up=True)
    unavailable = scaled_value(rolling.get("maxUnavailable", "25%"), wanted, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def max_surge(deployment: Mapping[str, Any]) -> int:
    """How many pods over spec.replicas a rollout may run."""
    return fenceposts(deployment)[0] if is_rolling(deployment) else 0


def max_unavailable(deployment: Mapping[str, Any]) -> int:
    """How many of spec.replicas may be unavailable during a rollout."""
    wanted = replicas(deployment)
    if not is_rolling(deployment) or wanted == 0:
        return 0
    return min(fenceposts(deployment)[1], wanted)


def _spec_int(deployment: Mapping[str, Any], key: str, default: int) -> int:
    value = (deployment.get("spec") or {}).get(key)
    return default if value is None else int(value)


def min_ready_seconds(obj: Mapping[str, Any]) -> int:
    """spec.minReadySeconds (0)."""
    return _spec_int(obj, "minReadySeconds", 0)


def revision_history_limit(deployment: Mapping[str, Any]) -> int:
    """spec.revisionHistoryLimit (10)."""
    return _spec_int(deployment, "revisionHistoryLimit", 10)


def progress_deadline(deployment: Mapping[str, Any]) -> int:
    """spec.progressDeadlineSeconds (600)."""
    return _spec_int(deployment, "progressDeadlineSeconds", 600)


# ------------------------------------------------------- the new ReplicaSet

_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # no vowels: no words in generated names


def template_hash(template: Mapping[str, Any], collision_count: int | None = None) -> str:
    """The pod-template-hash: FNV-32a of the template, in the API's safe alphabet."""
    data = json.dumps(template, sort_keys=True).encode()
    if collision_count:
        data += collision_count.to_bytes(4, "little")
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE[ord(c) % len(_SAFE)] for c in str(value))


def _without_hash(template: Mapping[str, Any]) -> dict[str, Any]:
    clean = copy.deepcopy(dict(template))
    ((clean.get("metadata") or {}).get("labels") or {}).pop(TEMPLATE_HASH_LABEL, None)
    return clean


def _created(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("creationTimestamp") or "", meta.get("name") or ""


def split(deployment: Mapping[str, Any], owned: Iterable[RS]) -> tuple[RS | None, list[RS]]:
    """(the new ReplicaSet, the old ones): the new one runs the current template."""
    ordered = sorted(owned, key=_created)
    wanted = _without_hash(deployment["spec"]["template"])
    new = next((rs for rs in ordered if _without_hash(rs["spec"]["template"]) == wanted), None)
    return new, [rs for rs in ordered if rs is not new]


def new_replica_set_replicas(deployment: Mapping[str, Any], every: Sequence[RS], new: RS) -> int:
    """The size the new ReplicaSet may have now (NewRSNewReplicas)."""
    wanted = replicas(deployment)
    if not is_rolling(deployment):
        return wanted
    current = sum(replicas(rs) for rs in every)
    room = wanted + max_surge(deployment) - current
    if room <= 0:
        return replicas(new)
    return replicas(new) + min(room, wanted - replicas(new))


def replica_annotations(deployment: Mapping[str, Any]) -> dict[str, str]:
    """desired-replicas and max-replicas, as the controller stamps its ReplicaSets."""
    wanted = replicas(deployment)
    return {DESIRED_REPLICAS: str(wanted), MAX_REPLICAS: str(wanted + max_surge(deployment))}


def new_replica_set(deployment: Mapping[str, Any], old: Sequence[RS]) -> RS:
    """The ReplicaSet for the current template, sized for the first step of the rollout."""
    meta, spec = deployment["metadata"], deployment["spec"]
    collisions = (deployment.get("status") or {}).get("collisionCount")
    pod_hash = template_hash(spec["template"], collisions)
    template = copy.deepcopy(spec["template"])
    template.setdefault("metadata", {}).setdefault("labels", {})[TEMPLATE_HASH_LABEL] = pod_hash
    selector = copy.deepcopy(spec.get("selector") or {})
    selector.setdefault("matchLabels", {})[TEMPLATE_HASH_LABEL] = pod_hash
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _NOT_COPIED}
    annotations[REVISION] = str(max((revision(rs) for rs in old), default=0) + 1)
    annotations.update(replica_annotations(deployment))
    rs: RS = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{meta['name']}-{pod_hash}",
            "namespace": meta["namespace"],
            "labels": dict(template["metadata"]["labels"]),
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "replicas": 0,
            "minReadySeconds": min_ready_seconds(deployment),
            "selector": selector,
            "template": template,
        },
    }
    rs["spec"]["replicas"] = new_replica_set_replicas(deployment, [*old, rs], rs)
    return rs


def synced_new_replica_set(deployment: Mapping[str, Any], new: RS, old: Sequence[RS]) -> RS | None:
    """The existing new ReplicaSet with its revision and minReadySeconds brought up to date;
    None if it already is (a rollback makes an old template new again, and the newest revision)."""
    updated = copy.deepcopy(new)
    meta = updated["metadata"]
    annotations = meta.setdefault("annotations", {})
    for key, value in (deployment["metadata"].get("annotations") or {}).items():
        if key not in _NOT_COPIED:
            annotations[key] = value
    wanted = max((revision(rs) for rs in old), default=0) + 1
    if revision(updated) < wanted:
        annotations[REVISION] = str(wanted)
    updated["spec"]["minReadySeconds"] = min_ready_seconds(deployment)
    return None if updated == new else updated


# ------------------------------------------------------------------ scaling


def reconcile_new(deployment: Mapping[str, Any], every: Sequence[RS], new: RS) -> int | None:
    """The new ReplicaSet's next size, or None if it stays (reconcileNewReplicaSet)."""
    wanted = replicas(deployment)
    if replicas(new) == wanted:
        return None
    if replicas(new) > wanted:
        return wanted
    size = new_replica_set_replicas(deployment, every, new)
    return None if size == replicas(new) else size


def old_scale_down(
    deployment: Mapping[str, Any], old: Sequence[RS], new: RS | None
) -> dict[str, int]:
    """Old ReplicaSets' next sizes, by name (reconcileOldReplicaSets).

    First the unavailable replicas of old ReplicaSets go, then available ones
    while the Deployment keeps spec.replicas - maxUnavailable available,
    oldest ReplicaSet first.
    """
    every = [*old, *([new] if new else [])]
    if sum(replicas(rs) for rs in old) == 0:
        return {}
    min_available = replicas(deployment) - max_unavailable(deployment)
    new_unavailable = replicas(new) - available(new) if new else 0
    budget = sum(replicas(rs) for rs in every) - min_available - new_unavailable
    if budget <= 0:
        return {}
    sizes = {rs["metadata"]["name"]: replicas(rs) for rs in old}
    oldest_first = sorted(old, key=_created)
    done = 0
    for rs in oldest_first:  # cleanupUnhealthyReplicas
        name = rs["metadata"]["name"]
        unhealthy = sizes[name] - available(rs)
        if done >= budget:
            break
        if sizes[name] == 0 or unhealthy <= 0:
            continue
        step = min(budget - done, unhealthy)
        sizes[name] -= step
        done += step
    can_go = sum(available(rs) for rs in every) - min_available
    done = 0
    for rs in oldest_first:  # scaleDownOldReplicaSetsForRollingUpdate
        name = rs["metadata"]["name"]
        if done >= can_go:
            break
        if sizes[name] == 0:
            continue
        step = min(sizes[name], can_go - done)
        sizes[name] -= step
        done += step
    return {name: size for name, size in sizes.items() if size != replicas(_by_name(old, name))}


def _by_name(sets: Iterable[RS], name: str) -> RS:
    return next(rs for rs in sets if rs["metadata"]["name"] == name)


def _active(sets: Iterable[RS | None]) -> list[RS]:
    return [rs for rs in sets if rs is not None and replicas(rs) > 0]


def is_scaling_event(deployment: Mapping[str, Any], new: RS | None, old: Sequence[RS]) -> bool:
    """spec.replicas changed since the active ReplicaSets were sized (isScalingEvent)."""
    wanted = replicas(deployment)
    for rs in _active([*old, new]):
        desired = _annotation_int(rs, DESIRED_REPLICAS)
        if desired is not None and desired != wanted:
            return True
    return False


def _saturated(deployment: Mapping[str, Any], new: RS | None) -> bool:
    wanted = replicas(deployment)
    return (
        new is not None
        and _annotation_int(new, DESIRED_REPLICAS) == wanted
        and replicas(new) == wanted
        and available(new) == wanted
    )


def _fraction(deployment: Mapping[str, Any], rs: RS) -> int:
    wanted = replicas(deployment)
    if wanted == 0:
        return -replicas(rs)
    before = _annotation_int(rs, MAX_REPLICAS) or _status(deployment, "replicas")
    if before == 0:
        return 0
    size = replicas(rs) * (wanted + max_surge(deployment)) / before
    return math.floor(size + 0.5) - replicas(rs)


def proportional_scale(
    deployment: Mapping[str, Any], new: RS | None, old: Sequence[RS]
) -> dict[str, int]:
    """Every ReplicaSet's size after spec.replicas changed, by name (`scale`).

    One active ReplicaSet takes the new size; a saturated new one leaves the
    old ones nothing; mid-rollout, the change is shared in proportion to each
    ReplicaSet's size, the rest going to the largest.
    """
    newest_old = sorted(old, key=_created, reverse=True)
    active = _active([*newest_old, new])
    wanted = replicas(deployment)
    if new is not None or old:
        if not active:
            latest = new if new is not None else newest_old[0]
            return {latest["metadata"]["name"]: wanted}
        if len(active) == 1:
            return {active[0]["metadata"]["name"]: wanted}
    if _saturated(deployment, new):
        return {rs["metadata"]["name"]: 0 for rs in _active(old)}
    if not is_rolling(deployment):
        return {}
    allowed = wanted + max_surge(deployment) if wanted > 0 else 0
    to_add = allowed - sum(replicas(rs) for rs in active)
    # Larger first; among equals, newer first when growing, older first when shrinking.
    by_age = sorted(active, key=_created, reverse=to_add > 0)
    ordered = sorted(by_age, key=lambda rs: -replicas(rs))
    sizes: dict[str, int] = {}
    added = 0
    for rs in ordered:
        share = 0
        if to_add != 0 and to_add != added:
            fraction = _fraction(deployment, rs)
            allowed_left = to_add - added
            share = min(fraction, allowed_left) if to_add > 0 else max(fraction, allowed_left)
        sizes[rs["metadata"]["name"]] = replicas(rs) + share
        added += share
    if ordered and to_add != 0:
        first = ordered[0]["metadata"]["name"]
        sizes[first] = max(0, sizes[first] + to_add - added)
    return sizes


def cleanup(deployment: Mapping[str, Any], old: Sequence[RS]) -> list[str]:
    """Old ReplicaSets to delete beyond revisionHistoryLimit, oldest revision first."""
    cleanable = [rs for rs in old if not rs["metadata"].get("deletionTimestamp")]
    extra = len(cleanable) - revision_history_limit(deployment)
    if extra <= 0:
        return []
    doomed = []
    for rs in sorted(cleanable, key=lambda rs: (revision(rs), _created(rs)))[:extra]:
        settled = _status(rs, "observedGeneration") >= rs["metadata"].get("generation", 1)
        if replicas(rs) == 0 and _status(rs, "replicas") == 0 and settled:
            doomed.append(rs["metadata"]["name"])
    return doomed


# ------------------------------------------------------------------- status


def condition(
    kind: str, status: bool, reason: str, message: str, now: datetime.datetime
) -> dict[str, Any]:
    """A DeploymentCondition, updated and transitioned now."""
    stamp = format_time(now)
    return {
        "type": kind,
        "status": "True" if status else "False",
        "lastUpdateTime": stamp,
        "lastTransitionTime": stamp,
        "reason": reason,
        "message": message,
    }


def get_condition(status: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """One condition of a status."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)


def set_condition(status: dict[str, Any], new: dict[str, Any]) -> None:
    """SetDeploymentCondition: no change for the same status and reason; the transition
    time survives a change of reason only."""
    current = get_condition(status, new["type"])
    if current and current["status"] == new["status"] and current["reason"] == new["reason"]:
        return
    if current and current["status"] == new["status"]:
        new = {**new, "lastTransitionTime": current["lastTransitionTime"]}
    remove_condition(status, new["type"])
    status.setdefault("conditions", []).append(new)


def remove_condition(status: dict[str, Any], kind: str) -> None:
    """Drop a condition (and the list, if it empties)."""
    kept = [c for c in status.get("conditions") or [] if c.get("type") != kind]
    if kept:
        status["conditions"] = kept
    else:
        status.pop("conditions", None)


def calculate_status(
    deployment: Mapping[str, Any], every: Sequence[RS], new: RS | None, now: datetime.datetime
) -> dict[str, Any]:
    """The counts and the Available condition (calculateStatus); zero counts are omitted."""
    total = sum(replicas(rs) for rs in every)
    ready_available = sum(available(rs) for rs in every)
    counts = {
        "observedGeneration": deployment["metadata"].get("generation", 1),
        "replicas": sum(_status(rs, "replicas") for rs in every),
        "updatedReplicas": _status(new, "replicas") if new else 0,
        "readyReplicas": sum(_status(rs, "readyReplicas") for rs in every),
        "availableReplicas": ready_available,
        "unavailableReplicas": max(0, total - ready_available),
    }
    status: dict[str, Any] = {k: v for k, v in counts.items() if v}
    old = deployment.get("status") or {}
    if old.get("collisionCount") is not None:
        status["collisionCount"] = old["collisionCount"]
    if old.get("conditions"):
        status["conditions"] = copy.deepcopy(old["conditions"])
    if ready_available >= replicas(deployment) - max_unavailable(deployment):
        found = condition(
            "Available", True, MIN_AVAILABLE, "Deployment has minimum availability.", now
        )
    else:
        found = condition(
            "Available",
            False,
            MIN_UNAVAILABLE,
            "Deployment does not have minimum availability.",
            now,
        )
    set_condition(status, found)
    return status


def complete(deployment: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """DeploymentComplete: every replica updated and available, the spec observed."""
    wanted = replicas(deployment)
    return (
        _status({"status": status}, "updatedReplicas") == wanted
        and _status({"status": status}, "replicas") == wanted
        and _status({"status": status}, "availableReplicas") == wanted
        and _status({"status": status}, "observedGeneration")
        >= deployment["metadata"].get("generation", 1)
    )


def _progressed(deployment: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    before = deployment.get("status") or {}

    def count(of: Mapping[str, Any], key: str) -> int:
        return int(of.get(key) or 0)

    old_before = count(before, "replicas") - count(before, "updatedReplicas")
    old_now = count(status, "replicas") - count(status, "updatedReplicas")
    return (
        count(status, "updatedReplicas") > count(before, "updatedReplicas")
        or count(status, "readyReplicas") > count(before, "readyReplicas")
        or old_now < old_before
        or count(status, "availableReplicas") > count(before, "availableReplicas")
    )


def _timed_out(
    deployment: Mapping[str, Any], status: Mapping[str, Any], now: datetime.datetime
) -> bool:
    found = get_condition(status, "Progressing")
    if found is None or found["reason"] == NEW_RS_AVAILABLE:
        return False
    if found["reason"] == TIMED_OUT:
        return True
    since = parse_time(found.get("lastUpdateTime"))
    deadline = datetime.timedelta(seconds=progress_deadline(deployment))
    return since is not None and since + deadline < now


def rollout_status(
    deployment: Mapping[str, Any],
    every: Sequence[RS],
    new: RS | None,
    now: datetime.datetime,
    replica_failure: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The status with the Progressing condition estimated (syncRolloutStatus)."""
    status = calculate_status(deployment, every, new, now)
    name = deployment["metadata"]["name"]
    subject = f'ReplicaSet "{new["metadata"]["name"]}"' if new else f'Deployment "{name}"'
    current = get_condition(deployment.get("status") or {}, "Progressing")
    finished = (
        status.get("replicas", 0) == status.get("updatedReplicas", 0)
        and current is not None
        and current["reason"] == NEW_RS_AVAILABLE
    )
    if not finished:
        if complete(deployment, status):
            found = condition(
                "Progressing",
                True,
                NEW_RS_AVAILABLE,
                f"{subject} has successfully progressed.",
                now,
            )
            set_condition(status, found)
        elif _progressed(deployment, status):
            found = condition("Progressing", True, RS_UPDATED, f"{subject} is progressing.", now)
            # Progress moves lastUpdateTime even when the reason stays.
            if current is not None and current["status"] == "True":
                found["lastTransitionTime"] = current["lastTransitionTime"]
            remove_condition(status, "Progressing")
            status.setdefault("conditions", []).append(found)
        elif _timed_out(deployment, status, now):
            found = condition(
                "Progressing", False, TIMED_OUT, f"{subject} has timed out progressing.", now
            )
            set_condition(status, found)
    if replica_failure is not None:
        set_condition(status, {**replica_failure})
    else:
        remove_condition(status, "ReplicaFailure")
    return status


def replica_failure(new: RS | None, every: Sequence[RS]) -> dict[str, Any] | None:
    """A ReplicaSet's ReplicaFailure condition as the Deployment's, the new one's first."""
    for rs in [*([new] if new else []), *every]:
        found = get_condition(rs.get("status") or {}, "ReplicaFailure")
        if found is not None:
            stamp = found.get("lastTransitionTime")
            return {**found, "lastUpdateTime": stamp, "lastTransitionTime": stamp}
    return None
