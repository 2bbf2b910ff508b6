"""The API server's change history, what watches stream from.

Every write gets the next resourceVersion and one event here. A watch that
starts at resourceVersion N gets the kept events after N, then the new ones
as they happen. The history is bounded, like etcd's after compaction: a watch
from a version older than what is kept gets 410 Gone ("too old resource
version"), and the client must list again. A watcher that falls behind by more
than the history also gets the 410.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import itertools
from dataclasses import dataclass
from typing import Any


class Expired(Exception):
    """The version asked for is older than the kept history (HTTP 410 Gone)."""

    def __init__(self, asked: int, oldest: int) -> None:
        self.asked, self.oldest = asked, oldest
        super().__init__(f"too old resource version: {asked} ({oldest})")


@dataclass(frozen=True, slots=True)
class Event:
    """One change: the resourceVersion it made, its resource, ADDED/MODIFIED/DELETED, the object."""

    version: int
    resource: Any
    type: str
    object: dict[str, Any]


class EventLog:
    """A bounded, ordered history of events, with waiting for new ones."""

    def __init__(self, size: int = 2000) -> None:
        self.size = size
        self._events: collections.deque[Event] = collections.deque()
        self._compacted = 0  # the newest version no longer kept
        self._last = 0
        self._newest = 0  # the newest version with its event recorded
        self._epoch = 0  # bumped to end every open watch
        self._changed: asyncio.Condition | None = None

    @property
    def last(self) -> int:
        """The newest resourceVersion handed out."""
        return self._last

    @property
    def newest(self) -> int:
        """The newest resourceVersion whose event is recorded."""
        return self._newest

    @property
    def epoch(self) -> int:
        """Changes when every open watch must end (`interrupt`)."""
        return self._epoch

    async def interrupt(self) -> None:
        """Wake every waiting watch with a new epoch, so that each ends its stream."""
        self._epoch += 1
        condition = self._condition()
        async with condition:
            condition.notify_all()

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def next_version(self) -> int:
        """A new resourceVersion (for a write; its event follows with `append`)."""
        self._last += 1
        return self._last

    async def append(self, resource: Any, kind: str, obj: dict[str, Any], version: int) -> None:
        """Record an event (of the version `next_version` gave) and wake the watchers."""
        assert version == self._newest + 1, "each version handed out is recorded, in order"
        self._events.append(Event(version, resource, kind, copy.deepcopy(obj)))
        self._newest = version
        while len(self._events) > self.size:
            self._compacted = self._events.popleft().version
        condition = self._condition()
        async with condition:
            condition.notify_all()

    def compact(self) -> None:
        """Forget the whole history (as etcd's compaction does), for tests of 410 Gone."""
        if self._events:
            self._compacted = self._events[-1].version
        self._events.clear()

    def since(self, version: int) -> list[Event]:
        """The kept events newer than `version` (raises Expired if some are no longer kept)."""
        if version < self._compacted:
            raise Expired(version, self._compacted + 1)
        if not self._events or version >= self._newest:
            return []
        # Every version handed out has its event, so they are consecutive: skip by offset
        # (each watcher asks on every change; a scan of the whole history would not scale).
        start = max(0, version - self._events[0].version + 1)
        return list(itertools.islice(self._events, start, None))

    async def wait(self, version: int, timeout: float | None) -> None:
        """Return once an event newer than `version` exists, on `interrupt`, or after `timeout` s."""
        epoch = self._epoch
        condition = self._condition()
        async with condition:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    condition.wait_for(lambda: self._newest > version or self._epoch != epoch),
                    timeout,
                )
