"""Leader election's I/O: read and write the Lease, on client-go's schedule.

    elector = LeaderElector(api, Lease("pagoda-system", "pagoda-operator"), identity())
    if await elector.acquire(stopping):      # blocks while another replica leads
        lost = await elector.keep(stopping)  # renews until stopping, or until it cannot
        ...
        await elector.release()              # on a graceful shutdown: a standby takes over at once

The decisions are leader.py's; this module only times them and talks to the
API. A leader that returns from `keep()` with `lost=True` must stop working at
once: a standby may take over `lease_duration` after it last saw a renewal.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagoda.operator import metrics
from pagoda.operator.api import KubeApi
from pagoda.operator.errors import ApiError
from pagoda.operator.leader import (
    JITTER,
    LeaseRecord,
    Observed,
    Timing,
    Verdict,
    decide,
    observe,
    released,
)

log = logging.getLogger("pagoda.operator.election")

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True, slots=True)
class Lease:
    """Where the Lease lives."""

    namespace: str
    name: str


def identity(pod_name: str | None = None) -> str:
    """This candidate's holderIdentity: the pod's name and a random suffix.

    The suffix tells apart two processes of the same pod (a container restart
    while the old record is still there), as client-go controllers do.
    """
    name = pod_name or os.environ.get("POD_NAME") or socket.gethostname()
    return f"{name}_{uuid.uuid4().hex[:10]}"


def pod_namespace(path: str = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """The namespace of the pod this runs in (None outside a cluster)."""
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


async def _sleep_or_stop(stopping: asyncio.Event, seconds: float) -> bool:
    """Sleep; True if `stopping` was set meanwhile."""
    try:
        await asyncio.wait_for(stopping.wait(), timeout=max(0.0, seconds))
    except TimeoutError:
        return False
    return True


class LeaderElector:
    """One candidate for one Lease."""

    def __init__(
        self,
        api: KubeApi,
        lease: Lease,
        identity: str,
        timing: Timing | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = _now,
    ) -> None:
        self.api = api
        self.lease = lease
        self.identity = identity
        self.timing = timing or Timing()
        self._clock = clock
        self._wall = wall
        self._observed: Observed | None = None
        self._stored: dict[str, Any] | None = None  # the Lease as last read or written
        self._gauge = metrics.LEADER.labels(f"{lease.namespace}/{lease.name}")
        self._gauge.set(0)

    @property
    def leading(self) -> bool:
        """Whether the record this candidate last saw names it as the holder."""
        return self._observed is not None and self._observed.record.holder == self.identity

    def _body(self, record: LeaseRecord) -> dict[str, Any]:
        """The Lease to write: the one read (its resourceVersion, for the precondition)."""
        meta = dict((self._stored or {}).get("metadata") or {})
        meta.update(name=self.lease.name, namespace=self.lease.namespace)
        meta.pop("managedFields", None)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": record.to_spec(),
        }

    async def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease, decide, write. True if this candidate now leads."""
        target = self.lease
        try:
            stored = await self.api.get("Lease", target.namespace, target.name)
        except ApiError as e:
            log.warning(f"cannot read the Lease {target.namespace}/{target.name}: {e}")
            return False
        now = self._clock()
        if stored is None:
            self._stored, self._observed = None, None
        else:
            self._stored = stored
            self._observed = observe(self._observed, LeaseRecord.from_lease(stored), now)
        decision = decide(self.identity, self._observed, now, self._wall(), self.timing)
        if decision.record is None:
            return False
        body = self._body(decision.record)
        try:
            if decision.verdict is Verdict.CREATE:
                written = await self.api.create(body)
            else:
                written = await self.api.replace(body)
        except ApiError as e:
            # A 409 is the other candidate's write winning: no harm, read again.
            level = logging.DEBUG if e.status == 409 else logging.WARNING
            log.log(level, f"cannot {decision.verdict.value} the Lease: {e}")
            return False
        if decision.verdict is not Verdict.RENEW:
            log.info(
                f"{self.identity} leads now ({decision.verdict.value}d the Lease "
                f"{target.namespace}/{target.name})"
            )
        self._stored = written
        self._observed = Observed(decision.record, now)
        return True

    def _jittered(self) -> float:
        return self.timing.retry_period * (1 + JITTER * random.random())

    async def acquire(self, stopping: asyncio.Event) -> bool:
        """Wait until this candidate leads (True) or `stopping` is set (False)."""
        holder = None
        while not stopping.is_set():
            if await self.try_acquire_or_renew():
                self._gauge.set(1)
                return True
            current = self._observed.record.holder if self._observed else None
            if current != holder:
                holder = current
                log.info(f"standing by: the Lease is held by {holder or 'nobody'}")
            if await _sleep_or_stop(stopping, self._jittered()):
                break
        return False

    async def keep(self, stopping: asyncio.Event) -> bool:
        """Renew every retry period until `stopping` (False) or a renewal fails for good (True).

        A renewal round retries until `renew_deadline` has passed; then
        leadership is lost, before any standby can take over.
        """
        while not await _sleep_or_stop(stopping, self.timing.retry_period):
            if await self._renew_round(stopping):
                continue
            if stopping.is_set():
                break
            self._gauge.set(0)
            log.error(
                f"{self.identity} could not renew the Lease within "
                f"{self.timing.renew_deadline:g}s: no longer leading"
            )
            return True
        return False

    async def _renew_round(self, stopping: asyncio.Event) -> bool:
        deadline = self._clock() + self.timing.renew_deadline
        while not stopping.is_set():
            left = deadline - self._clock()
            if left <= 0:
                return False
            try:
                if await asyncio.wait_for(self.try_acquire_or_renew(), timeout=left):
                    return True
            except TimeoutError:
                return False
            if not self.leading and self._observed is not None and self._observed.record.holder:
                return False  # someone else holds it: no renewal can succeed
            await _sleep_or_stop(stopping, min(self.timing.retry_period, left))
        return False

    async def release(self) -> None:
        """Give the Lease up (graceful shutdown): empty holder, so a standby takes it at once."""
        self._gauge.set(0)
        if not self.leading or self._observed is None:
            return
        record = released(self._observed.record, self._wall())
        try:
            self._stored = await self.api.replace(self._body(record))
        except ApiError as e:
            log.warning(f"cannot release the Lease (it expires by itself): {e}")
            return
        self._observed = Observed(record, self._clock())
        log.info(f"{self.identity} released the Lease")
