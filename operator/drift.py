"""What a write did to a child, told from the API server's answer (pure).

The operator server-side applies every child on every pass and lets the API
server decide what changes. A force-apply sets the fields this field manager
owns and leaves alone list entries and fields that other managers own
(`kubectl set env`, admission mutators such as Kyverno or a sidecar
injector, defaults the server fills in). An apply that changes nothing does
not change the object, nor its resourceVersion. So the drift check needs no
client-side comparison of lists, which would count other managers' entries
as drift and "repair" them forever:

* no live object before: Created;
* a different applied-hash on the live object: the spec changed, Updated;
* same hash, but the apply changed the object in one of the fields we
  render: someone edited our field by hand, Repaired (naming the fields);
* otherwise nothing happened, whatever else moved meanwhile.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

APPLIED_HASH = "pagoda.dev/applied-hash"


class Action(str, Enum):
    """What a write did to one child."""

    NONE = "none"
    CREATE = "create"
    UPDATE = "update"
    REPAIR = "repair"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome for one child and, for a repair, the fields found changed."""

    action: Action
    drifted: tuple[str, ...] = ()


def applied_hash(desired: Mapping[str, Any]) -> str:
    """A digest of a rendered object, ignoring the annotation that carries it."""
    clean = copy.deepcopy(dict(desired))
    annotations = clean.get("metadata", {}).get("annotations", {})
    annotations.pop(APPLIED_HASH, None)
    if not annotations:
        clean.get("metadata", {}).pop("annotations", None)
    return hashlib.sha256(json.dumps(clean, sort_keys=True).encode()).hexdigest()[:20]


def stamp(desired: Mapping[str, Any]) -> dict[str, Any]:
    """The object to write: the rendered one plus its applied-hash annotation."""
    stamped = copy.deepcopy(dict(desired))
    stamped["metadata"].setdefault("annotations", {})[APPLIED_HASH] = applied_hash(desired)
    return stamped


def _version(obj: Mapping[str, Any] | None) -> Any:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def _item(items: list[Any], name: Any) -> Any:
    return next((i for i in items if isinstance(i, dict) and i.get("name") == name), None)


def changed_fields(want: Any, before: Any, after: Any, path: str = "") -> list[str]:
    """Paths of fields we render whose value the write changed (before -> after).

    Only the fields in `want` are looked at, so fields and list entries other
    managers own never count. Lists of named items are matched by name.
    """
    if isinstance(want, dict):
        out: list[str] = []
        for key, sub in want.items():
            b = before.get(key) if isinstance(before, dict) else None
            a = after.get(key) if isinstance(after, dict) else None
            out += changed_fields(sub, b, a, f"{path}.{key}" if path else key)
        return out
    if isinstance(want, list) and want and all(isinstance(i, dict) and "name" in i for i in want):
        before_items = before if isinstance(before, list) else []
        after_items = after if isinstance(after, list) else []
        out = []
        for item in want:
            name = item["name"]
            out += changed_fields(
                item, _item(before_items, name), _item(after_items, name), f"{path}[{name}]"
            )
        return out
    return [] if before == after else [path]


def classify(
    desired: Mapping[str, Any], before: Mapping[str, Any] | None, after: Mapping[str, Any]
) -> Plan:
    """What applying `desired` did, from the object before and the server's answer."""
    if before is None:
        return Plan(Action.CREATE)
    live_hash = ((before.get("metadata") or {}).get("annotations") or {}).get(APPLIED_HASH)
    if live_hash != applied_hash(desired):
        return Plan(Action.UPDATE)
    if _version(before) == _version(after):
        return Plan(Action.NONE)
    drifted = changed_fields(dict(desired), before, after)
    return Plan(Action.REPAIR, tuple(drifted)) if drifted else Plan(Action.NONE)
