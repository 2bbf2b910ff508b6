"""What happens to a request inside the engine core, reported with its outputs.

The scheduler knows when it queues, admits and preempts a request; it records
the fact on the request and the next output carries it to the front end,
whose metrics (queue time, preemptions) read it there. vLLM V1 does the same.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class EngineCoreEventType(enum.IntEnum):
    QUEUED = 1
    SCHEDULED = 2  # admitted to the running batch (again, after a preemption)
    PREEMPTED = 3


@dataclass
class EngineCoreEvent:
    type: EngineCoreEventType
    # The engine core's monotonic clock, shared by every process on a host.
    timestamp: float
