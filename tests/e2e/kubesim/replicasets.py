"""The ReplicaSet controller: each ReplicaSet's pods, created, deleted and counted.

As kube-controller-manager's: a ReplicaSet counts its *active* pods (the
ones it controls, neither terminating nor stopped for good), creates pods
from its template (named `<replicaset>-<5 characters>`, owned by it with
controller=true) until there are spec.replicas of them and deletes the
surplus, the least useful first (`pods.deletion_rank`). Its status counts
replicas, fully labelled, ready and available ones (ready for
minReadySeconds), and a failed create or delete becomes a ReplicaFailure
condition (FailedCreate / FailedDelete), which the Deployment controller
passes on. Reduced: the scheduler is not simulated (a new pod is bound to
the node at once) and orphaned pods that match a selector are not adopted.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from kubesim.apiserver import ApiServer
from kubesim.controllers import call, log, send
from kubesim.labels import matches_selector, selector_of
from kubesim.pods import (
    active,
    controller_reference,
    controller_uid,
    deletion_rank,
    format_time,
    pod_available,
    pod_ready,
)
from kubesim.rollout import get_condition, min_ready_seconds, remove_condition, replicas
from kubesim.testing import PODS, REPLICASETS, path_of

NODE_NAME = "kubesim-node"


def pod_from_template(rs: dict[str, Any], node_name: str = NODE_NAME) -> dict[str, Any]:
    """A new pod for a ReplicaSet (controller.GetPodFromTemplate), bound to the node."""
    meta, template = rs["metadata"], rs["spec"]["template"]
    template_meta = template.get("metadata") or {}
    pod_meta: dict[str, Any] = {
        "generateName": f"{meta['name']}-",
        "namespace": meta["namespace"],
        "labels": dict(template_meta.get("labels") or {}),
        "annotations": dict(template_meta.get("annotations") or {}),
        "ownerReferences": [controller_reference(rs)],
    }
    if template_meta.get("finalizers"):
        pod_meta["finalizers"] = list(template_meta["finalizers"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_meta,
        "spec": {**copy.deepcopy(template.get("spec") or {}), "nodeName": node_name},
        # What the API server sets on every new pod.
        "status": {"phase": "Pending"},
    }


def replica_set_status(
    rs: dict[str, Any],
    pods: list[dict[str, Any]],
    now: datetime.datetime,
    failure: tuple[str, str] | None,
) -> dict[str, Any]:
    """The status of a ReplicaSet over its active pods (calculateStatus).

    `failure` is (reason, message) of a create or delete that failed in this pass.
    """
    status = copy.deepcopy(rs.get("status") or {})
    template_labels = ((rs["spec"].get("template") or {}).get("metadata") or {}).get("labels") or {}
    wanted = selector_of(template_labels)
    ready = [p for p in pods if pod_ready(p)]
    min_ready = min_ready_seconds(rs)
    counts = {
        "fullyLabeledReplicas": sum(
            1 for p in pods if matches_selector(wanted, p["metadata"].get("labels") or {})
        ),
        "readyReplicas": len(ready),
        "availableReplicas": sum(1 for p in ready if pod_available(p, min_ready, now)),
        "observedGeneration": rs["metadata"].get("generation", 1),
    }
    for key, value in counts.items():
        if value:
            status[key] = value
        else:
            status.pop(key, None)
    status["replicas"] = len(pods)  # the one count the API always writes
    current = get_condition(status, "ReplicaFailure")
    if failure is not None and current is None:
        reason, message = failure
        status.setdefault("conditions", []).append(
            {
                "type": "ReplicaFailure",
                "status": "True",
                "lastTransitionTime": format_time(now),
                "reason": reason,
                "message": message,
            }
        )
    elif failure is None and current is not None:
        remove_condition(status, "ReplicaFailure")
    return status


class ReplicaSetController:
    """spec.replicas active pods for each ReplicaSet."""

    manager = "replicaset-controller"

    def __init__(self, server: ApiServer) -> None:
        self.server = server

    async def sync(self) -> None:
        """One pass over every ReplicaSet."""
        pods = self.server.list_objects(PODS)
        for rs in self.server.list_objects(REPLICASETS):
            meta = rs["metadata"]
            owned = [
                p
                for p in pods
                if p["metadata"].get("namespace") == meta["namespace"]
                and controller_uid(p) == meta["uid"]
            ]
            await self._sync_one(rs, owned)

    async def _sync_one(self, rs: dict[str, Any], owned: list[dict[str, Any]]) -> None:
        meta = rs["metadata"]
        pods = [p for p in owned if active(p)]
        failure = None
        if not meta.get("deletionTimestamp"):
            failure = await self._manage(rs, pods)
        status = replica_set_status(rs, pods, datetime.datetime.now(datetime.timezone.utc), failure)
        if status != (rs.get("status") or {}):
            path = path_of(REPLICASETS, meta["namespace"], meta["name"]) + "/status"
            params = {"fieldManager": self.manager}
            await send(self.server, "PUT", path, json={**rs, "status": status}, params=params)

    async def _manage(
        self, rs: dict[str, Any], pods: list[dict[str, Any]]
    ) -> tuple[str, str] | None:
        """Create or delete pods toward spec.replicas; (reason, message) of the first failure."""
        meta = rs["metadata"]
        diff = len(pods) - replicas(rs)
        params = {"fieldManager": self.manager}
        if diff < 0:
            for _ in range(-diff):
                body = pod_from_template(rs)
                code, answer = await call(
                    self.server, "POST", path_of(PODS, meta["namespace"]), json=body, params=params
                )
                if code >= 300:
                    log.warning("replicaset %s: creating a pod: %s %s", meta["name"], code, answer)
                    return "FailedCreate", _message(answer)
        for pod in sorted(pods, key=deletion_rank)[: max(0, diff)]:
            path = path_of(PODS, meta["namespace"], pod["metadata"]["name"])
            code, answer = await call(self.server, "DELETE", path)
            if code >= 300 and code != 404:
                return "FailedDelete", _message(answer)
        return None


def _message(answer: Any) -> str:
    return str(answer.get("message", answer)) if isinstance(answer, dict) else str(answer)
