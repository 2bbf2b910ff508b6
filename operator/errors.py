"""Errors from the Kubernetes API, and what to do about each (pure).

Two kinds, as controllers conventionally split them:

* permanent: a 4xx other than 409 and 429. The request itself is wrong (a 422
  for an invalid affinity, a 403 for a missing RBAC rule) and sending it again
  gives the same answer. It becomes a condition and an Event; the operator
  tries again only on the next change or resync, never in a hot loop.
* transient: 409 Conflict, 429 Too Many Requests, 5xx, and no answer at all.
  Retried with exponential backoff.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


class ApiError(Exception):
    """A failed API call; `status` is None when no answer arrived."""

    def __init__(self, status: int | None, reason: str, message: str, target: str = "") -> None:
        where = f"{target}: " if target else ""
        code = f"{status} " if status is not None else ""
        super().__init__(f"{where}{code}{reason}: {message}".rstrip(": "))
        self.status = status
        self.reason = reason
        self.message = message
        self.target = target

    @property
    def permanent(self) -> bool:
        """Whether repeating the same request can only fail the same way."""
        return is_permanent(self.status)


def is_permanent(status: int | None) -> bool:
    """4xx except 409 (conflict: re-read and retry) and 429 (throttled: wait and retry)."""
    return status is not None and 400 <= status < 500 and status not in (409, 429)


def condition_reason(status: int | None) -> str:
    """The Degraded reason a permanent error is reported under."""
    if status in (400, 422):
        # The API server refused what the spec rendered (say, an invalid
        # affinity passed through as is): the spec is what has to change.
        return "InvalidSpec"
    if status in (401, 403):
        return "Forbidden"
    return "ApiRejected"


@dataclass(slots=True)
class Backoff:
    """Exponential backoff for transient errors, with jitter.

    The n-th delay is drawn from [(1 - jitter) x d, d] where d = first x 2^n,
    capped at `cap` seconds: when the API server comes back after an outage,
    the loops of many LLMServices (and of other controllers) that failed
    together must not all retry at the same instant.
    """

    first: float = 1.0
    cap: float = 60.0
    jitter: float = 0.5
    failures: int = 0
    random: Callable[[], float] = field(default=random.random, repr=False)

    def next(self) -> float:
        """The delay before the next attempt."""
        delay = min(self.cap, self.first * 2 ** min(self.failures, 62))
        self.failures += 1
        return delay * (1.0 - self.jitter * self.random())

    def reset(self) -> None:
        """A success: start from `first` again."""
        self.failures = 0
