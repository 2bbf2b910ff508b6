"""Leader election on a `coordination.k8s.io/v1` Lease: the decisions, without the I/O.

This is client-go's algorithm (k8s.io/client-go/tools/leaderelection), which
every Kubernetes controller with replicas uses, so it behaves as operators of
a cluster expect:

* A candidate reads the Lease every `retry_period`. The leader writes
  `renewTime` each time; a standby takes the Lease only when its holder has
  not renewed it for `leaseDurationSeconds`, or when the holder is empty (a
  leader that shut down gracefully releases it).
* "Has not renewed" is judged by the standby's own clock: it remembers when
  it last saw the record change (`Observed.at`, a monotonic time) and never
  compares the remote `renewTime` with its own wall clock, so clock skew
  between nodes cannot make two leaders.
* Every write carries the resourceVersion that was read, so of two
  candidates that decide to take the same expired Lease the API server lets
  exactly one succeed (409 Conflict for the other).
* A leader that could not renew for `renew_deadline` stops leading; since
  `renew_deadline < lease_duration`, it stops before any standby may take
  over.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# client-go's JitterFactor: a candidate waits retry_period * (1 + jitter * rand).
JITTER = 1.2


@dataclass(frozen=True, slots=True)
class Timing:
    """How long a Lease lasts, how long a leader keeps trying to renew, how often to try.

    The defaults are those of kube-controller-manager and controller-runtime.
    """

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        # client-go's own checks (NewLeaderElector): the leader must give up
        # before a standby may take over, and retry at least once before that.
        if self.retry_period <= 0:
            raise ValueError("the retry period must be positive")
        if self.renew_deadline <= JITTER * self.retry_period:
            raise ValueError("the renew deadline must exceed 1.2 x the retry period")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("the lease duration must exceed the renew deadline")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The Lease's spec: who holds it, since when, for how long."""

    holder: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    lease_transitions: int = 0

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        """Read the record from a Lease object (a JSON dict)."""
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=_normalized(spec.get("acquireTime")),
            renew_time=_normalized(spec.get("renewTime")),
            lease_transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        """The Lease's spec for this record."""
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.lease_transitions,
        }


@dataclass(frozen=True, slots=True)
class Observed:
    """The record a candidate last read, and when (its monotonic clock) it last changed."""

    record: LeaseRecord
    at: float


def observe(previous: Observed | None, record: LeaseRecord, now: float) -> Observed:
    """Remember `record`; the clock restarts only when it differs from the one seen before."""
    if previous is not None and previous.record == record:
        return previous
    return Observed(record, now)


def micro_time(when: datetime.datetime) -> str:
    """A MicroTime as the API server writes it: RFC 3339 with microseconds, in UTC."""
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _normalized(stamp: Any) -> str | None:
    """A MicroTime in one spelling, so that equal times compare equal.

    The official client sends its own (an ISO offset instead of Z), and API
    servers differ in how many fractional digits they keep.
    """
    if not stamp:
        return None
    try:
        return micro_time(datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")))
    except ValueError:
        return str(stamp)  # unreadable: kept as is, still compared as written


class Verdict(enum.Enum):
    """What a candidate does after reading the Lease."""

    CREATE = "create"  # there is no Lease: create it, holding it
    ACQUIRE = "acquire"  # free or expired: take it over
    RENEW = "renew"  # ours: write a new renewTime
    FOLLOW = "follow"  # another holder's, not expired: wait and read again


@dataclass(frozen=True, slots=True)
class Decision:
    """A verdict, and the record to write for it (None when there is nothing to write)."""

    verdict: Verdict
    record: LeaseRecord | None = None

    @property
    def leads(self) -> bool:
        """Whether the candidate leads once `record` is written."""
        return self.verdict is not Verdict.FOLLOW


def decide(
    identity: str,
    observed: Observed | None,
    now: float,
    wall: datetime.datetime,
    timing: Timing,
) -> Decision:
    """What `identity` does with the Lease it observed (None: no Lease exists).

    `now` is the candidate's monotonic clock, `wall` the time written into
    the record (for humans and `kubectl`; no candidate's decision reads it).
    """
    stamp = micro_time(wall)
    duration = max(1, round(timing.lease_duration))
    if observed is None:
        return Decision(Verdict.CREATE, LeaseRecord(identity, duration, stamp, stamp, 0))
    old = observed.record
    if old.holder == identity:
        renewed = LeaseRecord(identity, duration, old.acquire_time, stamp, old.lease_transitions)
        return Decision(Verdict.RENEW, renewed)
    if old.holder and now < observed.at + old.lease_duration_seconds:
        return Decision(Verdict.FOLLOW)
    taken = LeaseRecord(identity, duration, stamp, stamp, old.lease_transitions + 1)
    return Decision(Verdict.ACQUIRE, taken)


def released(record: LeaseRecord, wall: datetime.datetime) -> LeaseRecord:
    """The record a leader writes on a graceful shutdown, so a standby takes over at once.

    As client-go: no holder, a one-second duration, the transitions kept.
    """
    stamp = micro_time(wall)
    return LeaseRecord("", 1, stamp, stamp, record.lease_transitions)
