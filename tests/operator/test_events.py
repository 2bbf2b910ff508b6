"""Rate-limiting Events."""

from __future__ import annotations

from pagoda.operator.events import EventLimiter

REFUSED = ("Warning", "ScaleRefused", "1 -> 4: 422 Invalid")


def test_the_same_event_is_posted_once_per_interval() -> None:
    limiter = EventLimiter(interval=600.0)
    assert [limiter.allow(REFUSED, t) for t in (0.0, 5.0, 599.0, 600.0, 605.0)] == [
        True,
        False,
        False,
        True,
        False,
    ]


def test_distinct_events_are_each_posted() -> None:
    limiter = EventLimiter(interval=600.0)
    other = ("Warning", "ScaleRefused", "1 -> 3: 422 Invalid")
    assert limiter.filter([REFUSED, other, REFUSED], 0.0) == [REFUSED, other]


def test_it_remembers_only_what_can_still_hold_an_event_back() -> None:
    limiter = EventLimiter(interval=10.0)
    for i in range(100):
        limiter.allow(("Normal", "ScaledUp", str(i)), float(i))
    assert len(limiter._last) <= 10
