"""Wake-up calls: a watch event on a child reaches the loop of the LLMService that owns it.

Each LLMService has one sync loop (loops.py) that reconciles when woken
and, as a safety net, every `resync_seconds`. The operator watches the kinds
it owns (Deployments, Services, ConfigMaps, PodDisruptionBudgets, the runtime
pods and the Service's EndpointSlices); `owner_key` maps each event to the
owning LLMService and `Triggers.poke` wakes its loop, so repair and status
follow a change within seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pagoda.operator.render.labels import OWNER_LABEL

Key = tuple[str, str]  # (namespace, name) of an LLMService
# EndpointSlices carry their Service's name; the Service shares the LLMService's.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def owner_key(kind: str, body: Mapping[str, Any]) -> Key | None:
    """The LLMService an object belongs to, from its labels; None if none."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    name = labels.get(SERVICE_NAME_LABEL if kind == "EndpointSlice" else OWNER_LABEL)
    namespace = meta.get("namespace")
    return (namespace, name) if name and namespace else None


@dataclass(slots=True)
class Wake:
    """One loop's wake-up flag and the generation it last reconciled."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    generation: int | None = None


class Triggers:
    """The registry of running sync loops, shared by every handler (kept in kopf's memo)."""

    def __init__(self) -> None:
        self._loops: dict[Key, Wake] = {}

    def register(self, key: Key) -> Wake:
        """A loop starts; returns its wake-up flag."""
        wake = self._loops[key] = Wake()
        return wake

    def unregister(self, key: Key, wake: Wake) -> None:
        """A loop ends (only if it is still the registered one)."""
        if self._loops.get(key) is wake:
            del self._loops[key]

    def poke(self, key: Key | None) -> bool:
        """Wake the loop of `key`, if one runs."""
        wake = self._loops.get(key) if key is not None else None
        if wake is None:
            return False
        wake.event.set()
        return True

    def poke_if_new_generation(self, key: Key, generation: int | None) -> bool:
        """Wake the loop if the LLMService's spec changed since its last reconcile.

        The operator's own status writes change the object too; they change
        no generation, so they wake nothing.
        """
        wake = self._loops.get(key)
        if wake is None or generation == wake.generation:
            return False
        wake.event.set()
        return True
