"""Whose object is it? (pure)

A child is this LLMService's only if its ownerReferences carry the
LLMService's uid. Anything else that happens to have the same name (a user's
own Service or ConfigMap, a PodDisruptionBudget someone wrote by hand, an
object of another controller) is never adopted, overwritten or deleted: the
LLMService reports a `ChildConflict` instead, naming the object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Conflict:
    """A child's name is taken by an object this LLMService does not own."""

    kind: str
    name: str
    holder: str

    def message(self) -> str:
        """What the user reads in the condition and the Event."""
        return (
            f"{self.kind} {self.name} already exists and is not owned by this LLMService "
            f"({self.holder}); the operator leaves it alone: delete or rename it"
        )


def owned_by(live: Mapping[str, Any], uid: str | None) -> bool:
    """Whether `live` names the LLMService with this uid among its owners."""
    refs = (live.get("metadata") or {}).get("ownerReferences") or []
    return uid is not None and any(ref.get("uid") == uid for ref in refs)


def holder(live: Mapping[str, Any]) -> str:
    """Who holds an object, in words."""
    refs = (live.get("metadata") or {}).get("ownerReferences") or []
    if not refs:
        return "it has no owner"
    ref = next((r for r in refs if r.get("controller")), refs[0])
    return f"owned by {ref.get('kind')} {ref.get('name')}"


def conflict(kind: str, live: Mapping[str, Any] | None, uid: str | None) -> Conflict | None:
    """The conflict if `live` exists and is not ours; None if it is free or ours."""
    if live is None or owned_by(live, uid):
        return None
    return Conflict(kind, (live.get("metadata") or {}).get("name", "?"), holder(live))
