"""The Deployment controller: a ReplicaSet per pod-template revision, rolled and counted.

As kube-controller-manager's (the decisions are in `rollout`): the ReplicaSet
running the current template is the new one, `<deployment>-<pod-template-
hash>`, created when the template changes, with the revision annotation
(one more than any old ReplicaSet's) that the Deployment then carries too. A
rolling update scales it up within maxSurge and the old ones down while
spec.replicas - maxUnavailable pods stay available; a change of spec.replicas
mid-rollout is shared among the ReplicaSets in proportion; once the rollout
is complete, old ReplicaSets beyond revisionHistoryLimit are deleted. The
status carries the counts and the Available and Progressing conditions, with
ProgressDeadlineExceeded after progressDeadlineSeconds without progress.

Reduced: the Recreate strategy is treated as RollingUpdate, `paused` and
rollbacks through `rollbackTo` are not implemented, orphaned ReplicaSets are
not adopted, and no Events are posted.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from kubesim import rollout
from kubesim.apiserver import MERGE, ApiServer
from kubesim.controllers import send
from kubesim.pods import controller_uid
from kubesim.testing import DEPLOYMENTS, REPLICASETS, path_of

RS = dict[str, Any]


class DeploymentController:
    """ReplicaSets for each Deployment."""

    manager = "deployment-controller"

    def __init__(self, server: ApiServer) -> None:
        self.server = server

    async def sync(self) -> None:
        """One pass over every Deployment."""
        sets = self.server.list_objects(REPLICASETS)
        for deployment in self.server.list_objects(DEPLOYMENTS):
            meta = deployment["metadata"]
            owned = [
                rs
                for rs in sets
                if rs["metadata"].get("namespace") == meta["namespace"]
                and controller_uid(rs) == meta["uid"]
            ]
            await self._sync_one(deployment, owned)

    async def _sync_one(self, deployment: dict[str, Any], owned: list[RS]) -> None:
        now = datetime.datetime.now(datetime.timezone.utc)
        before = copy.deepcopy(deployment.get("status") or {})
        deployment["status"] = copy.deepcopy(before)
        new, old = rollout.split(deployment, owned)
        if deployment["metadata"].get("deletionTimestamp"):
            every = [*old, *([new] if new else [])]
            status = rollout.calculate_status(deployment, every, new, now)
        elif rollout.is_scaling_event(deployment, new, old):
            new = await self._sync_new(deployment, new, old, now, create=False)
            every = [*old, *([new] if new else [])]
            for name, size in rollout.proportional_scale(deployment, new, old).items():
                await self._scale(deployment, next(rs for rs in every if _name(rs) == name), size)
            await self._clean_up(deployment, old, before)
            status = rollout.calculate_status(deployment, every, new, now)
        else:
            new = await self._sync_new(deployment, new, old, now, create=True)
            if new is None:
                return  # the create raced with another writer: look again next pass
            every = [*old, new]
            size = rollout.reconcile_new(deployment, every, new)
            if size is not None:
                await self._scale(deployment, new, size)
            else:
                sizes = rollout.old_scale_down(deployment, old, new)
                for name, old_size in sizes.items():
                    await self._scale(
                        deployment, next(rs for rs in old if _name(rs) == name), old_size
                    )
                if not sizes:
                    await self._clean_up(deployment, old, before)
            failure = rollout.replica_failure(new, every)
            status = rollout.rollout_status(deployment, every, new, now, failure)
        if status != before:
            meta = deployment["metadata"]
            path = path_of(DEPLOYMENTS, meta["namespace"], meta["name"]) + "/status"
            params = {"fieldManager": self.manager}
            await send(
                self.server, "PUT", path, json={**deployment, "status": status}, params=params
            )

    async def _sync_new(
        self,
        deployment: dict[str, Any],
        new: RS | None,
        old: list[RS],
        now: datetime.datetime,
        create: bool,
    ) -> RS | None:
        """The new ReplicaSet, created (if `create`) or brought up to date (getNewReplicaSet).

        Records the first Progressing condition in the Deployment's status (in
        memory: the caller writes the status) and the revision on the Deployment.
        """
        meta = deployment["metadata"]
        has_deadline = rollout.progress_deadline(deployment) != 2**31 - 1
        status = deployment["status"]
        if new is not None:
            updated = rollout.synced_new_replica_set(deployment, new, old)
            if updated is not None:
                path = path_of(REPLICASETS, meta["namespace"], _name(new))
                params = {"fieldManager": self.manager}
                new = await send(self.server, "PUT", path, json=updated, params=params) or updated
            elif has_deadline and rollout.get_condition(status, "Progressing") is None:
                message = f'Found new replica set "{_name(new)}"'
                found = rollout.condition("Progressing", True, rollout.FOUND_NEW_RS, message, now)
                rollout.set_condition(status, found)
        elif create:
            body = rollout.new_replica_set(deployment, old)
            params = {"fieldManager": self.manager}
            path = path_of(REPLICASETS, meta["namespace"])
            new = await send(self.server, "POST", path, json=body, params=params)
            if new is None:
                return None
            if has_deadline:
                message = f'Created new replica set "{_name(new)}"'
                found = rollout.condition("Progressing", True, rollout.NEW_RS_CREATED, message, now)
                rollout.set_condition(status, found)
        if new is not None:
            await self._record_revision(deployment, new)
        return new

    async def _record_revision(self, deployment: dict[str, Any], new: RS) -> None:
        """The Deployment's revision annotation follows its new ReplicaSet's."""
        meta = deployment["metadata"]
        wanted = str(rollout.revision(new))
        if (meta.get("annotations") or {}).get(rollout.REVISION) == wanted:
            return
        body = {"metadata": {"annotations": {rollout.REVISION: wanted}}}
        path = path_of(DEPLOYMENTS, meta["namespace"], meta["name"])
        params = {"fieldManager": self.manager}
        headers = {"Content-Type": MERGE}
        await send(self.server, "PATCH", path, json=body, headers=headers, params=params)
        meta.setdefault("annotations", {})[rollout.REVISION] = wanted

    async def _scale(self, deployment: dict[str, Any], rs: RS, size: int) -> None:
        """Resize a ReplicaSet and stamp it with the Deployment's size (scaleReplicaSet).

        The ReplicaSet is updated in place: the status computed after this
        pass counts its new spec.replicas, as the real controller's does.
        """
        annotations = rollout.replica_annotations(deployment)
        current = rs["metadata"].get("annotations") or {}
        stale = any(current.get(k) != v for k, v in annotations.items())
        if rollout.replicas(rs) == size and not stale:
            return
        body = {"metadata": {"annotations": annotations}, "spec": {"replicas": size}}
        meta = rs["metadata"]
        path = path_of(REPLICASETS, meta["namespace"], meta["name"])
        params = {"fieldManager": self.manager}
        headers = {"Content-Type": MERGE}
        if await send(self.server, "PATCH", path, json=body, headers=headers, params=params):
            meta.setdefault("annotations", {}).update(annotations)
            rs["spec"]["replicas"] = size

    async def _clean_up(
        self, deployment: dict[str, Any], old: list[RS], before: dict[str, Any]
    ) -> None:
        """Once a rollout is complete, delete the ReplicaSets beyond revisionHistoryLimit."""
        if not rollout.complete(deployment, before):
            return
        for name in rollout.cleanup(deployment, old):
            path = path_of(REPLICASETS, deployment["metadata"]["namespace"], name)
            await send(self.server, "DELETE", path)


def _name(obj: dict[str, Any]) -> str:
    return obj["metadata"]["name"]
