"""Leader election's decisions (client-go's algorithm), without an API server."""

from __future__ import annotations

import datetime

import pytest
from pagoda.operator.leader import (
    LeaseRecord,
    Observed,
    Timing,
    Verdict,
    decide,
    micro_time,
    observe,
    released,
)

TIMING = Timing()  # 15 s lease, 10 s renew deadline, 2 s retry period
WALL = datetime.datetime(2026, 11, 27, 3, 0, 0, 123456, tzinfo=datetime.timezone.utc)
STAMP = "2026-11-27T03:00:00.123456Z"
EARLIER = "2026-11-27T02:59:00.000000Z"


def held_by(holder: str, transitions: int = 3, duration: int = 15) -> LeaseRecord:
    return LeaseRecord(holder, duration, EARLIER, EARLIER, transitions)


def test_the_first_candidate_creates_the_lease_holding_it() -> None:
    decision = decide("a", None, now=100.0, wall=WALL, timing=TIMING)
    assert decision.verdict is Verdict.CREATE and decision.leads
    assert decision.record == LeaseRecord("a", 15, STAMP, STAMP, 0)


def test_a_standby_follows_a_lease_renewed_within_its_duration() -> None:
    observed = Observed(held_by("b"), at=100.0)
    decision = decide("a", observed, now=114.9, wall=WALL, timing=TIMING)
    assert decision.verdict is Verdict.FOLLOW and not decision.leads
    assert decision.record is None


def test_a_standby_takes_over_once_the_lease_expired_by_its_own_clock() -> None:
    observed = Observed(held_by("b", transitions=3), at=100.0)
    decision = decide("a", observed, now=115.0, wall=WALL, timing=TIMING)
    assert decision.verdict is Verdict.ACQUIRE
    # A takeover counts as a transition and starts a new acquireTime.
    assert decision.record == LeaseRecord("a", 15, STAMP, STAMP, 4)


def test_expiry_uses_the_duration_the_holder_wrote() -> None:
    observed = Observed(held_by("b", duration=60), at=100.0)
    assert decide("a", observed, now=130.0, wall=WALL, timing=TIMING).verdict is Verdict.FOLLOW
    assert decide("a", observed, now=160.0, wall=WALL, timing=TIMING).verdict is Verdict.ACQUIRE


def test_remote_timestamps_never_decide_expiry() -> None:
    # The holder's renewTime is a year old by our wall clock (a skewed node):
    # what counts is that we saw the record change only just now.
    old = LeaseRecord("b", 15, "2025-01-01T00:00:00.000000Z", "2025-01-01T00:00:00.000000Z", 1)
    observed = Observed(old, at=100.0)
    assert decide("a", observed, now=101.0, wall=WALL, timing=TIMING).verdict is Verdict.FOLLOW


def test_the_holder_renews_keeping_acquire_time_and_transitions() -> None:
    observed = Observed(held_by("a", transitions=7), at=100.0)
    decision = decide("a", observed, now=500.0, wall=WALL, timing=TIMING)
    assert decision.verdict is Verdict.RENEW
    assert decision.record == LeaseRecord("a", 15, EARLIER, STAMP, 7)


def test_a_released_lease_is_taken_at_once() -> None:
    free = released(held_by("b", transitions=2), WALL)
    assert free == LeaseRecord("", 1, STAMP, STAMP, 2)
    decision = decide("a", Observed(free, at=100.0), now=100.0, wall=WALL, timing=TIMING)
    assert decision.verdict is Verdict.ACQUIRE and decision.record is not None
    assert decision.record.lease_transitions == 3 and decision.record.holder == "a"


def test_the_observation_clock_restarts_only_when_the_record_changes() -> None:
    first = observe(None, held_by("b"), now=100.0)
    assert observe(first, held_by("b"), now=110.0) is first
    renewed = LeaseRecord("b", 15, EARLIER, STAMP, 3)
    assert observe(first, renewed, now=110.0) == Observed(renewed, 110.0)


def test_a_holder_that_keeps_renewing_is_never_taken_over() -> None:
    observed: Observed | None = None
    for second in range(0, 60, 2):  # renewed every retry period
        stamp = f"2026-11-27T03:00:{second:02d}.000000Z"
        observed = observe(observed, LeaseRecord("b", 15, EARLIER, stamp, 1), float(second))
        decision = decide("a", observed, now=second + 1.9, wall=WALL, timing=TIMING)
        assert decision.verdict is Verdict.FOLLOW


def test_a_record_round_trips_through_the_lease_spec() -> None:
    record = LeaseRecord("a_12ab", 15, EARLIER, STAMP, 2)
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": record.to_spec()}
    assert LeaseRecord.from_lease(lease) == record
    assert LeaseRecord.from_lease({"metadata": {"name": "x"}}) == LeaseRecord()


def test_times_read_back_in_another_spelling_are_the_same_record() -> None:
    # The official client sends an offset; an API server may keep fewer digits.
    spec = {"holderIdentity": "a", "acquireTime": "2026-11-27T03:00:00.123456+00:00"}
    assert LeaseRecord.from_lease({"spec": spec}).acquire_time == STAMP
    spec = {"holderIdentity": "a", "renewTime": "2026-11-27T02:59:00Z"}
    assert LeaseRecord.from_lease({"spec": spec}).renew_time == EARLIER


def test_micro_time_is_rfc3339_with_microseconds_in_utc() -> None:
    cest = datetime.timezone(datetime.timedelta(hours=2))
    assert micro_time(WALL.astimezone(cest)) == STAMP


@pytest.mark.parametrize(
    ("lease", "renew", "retry"),
    [(10.0, 10.0, 2.0), (15.0, 2.4, 2.0), (15.0, 10.0, 0.0)],
    ids=["lease-not-above-deadline", "deadline-within-one-jittered-retry", "no-retry-period"],
)
def test_timings_that_could_make_two_leaders_are_refused(
    lease: float, renew: float, retry: float
) -> None:
    with pytest.raises(ValueError):
        Timing(lease_duration=lease, renew_deadline=renew, retry_period=retry)
