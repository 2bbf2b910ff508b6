"""How often the same Event may be posted (pure).

A condition that persists (a scale write the API server keeps refusing, a
pod that keeps failing) would otherwise post the same Warning on every tick:
noise in `kubectl describe`, load on the API server, and the Events that
matter scroll away. The API server's own aggregation only merges Events
after the fact; this keeps them from being posted at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EventTuple = tuple[str, str, str]  # (type, reason, message)


@dataclass(slots=True)
class EventLimiter:
    """Lets each distinct Event through at most once per `interval` seconds."""

    interval: float = 600.0
    _last: dict[EventTuple, float] = field(default_factory=dict)

    def allow(self, event: EventTuple, now: float) -> bool:
        """Whether to post `event` at time `now` (seconds, any monotonic origin)."""
        last = self._last.get(event)
        if last is not None and now - last < self.interval:
            return False
        # Forget what can no longer hold anything back, so the memory stays small.
        for old, when in list(self._last.items()):
            if now - when >= self.interval:
                del self._last[old]
        self._last[event] = now
        return True

    def filter(self, events: list[EventTuple], now: float) -> list[EventTuple]:
        """The events of `events` that may be posted now, in order."""
        return [event for event in events if self.allow(event, now)]
