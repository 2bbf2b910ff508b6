"""Decide whether a child needs a write: desired vs live, on the fields we own.

Two checks, both pure:

* the applied hash: every object we write carries a digest of what we rendered.
  A different digest means the spec changed, including fields we *stopped*
  setting, which no comparison of the live object could notice;
* the subset check: every field we render must still hold its value live. The
  API server adds defaults (imagePullPolicy, terminationMessagePath...), so
  equality would never hold; a hand edit of one of *our* fields breaks it.

Equal on both counts means no write at all, so a steady state costs only reads.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import Enum
from typing import Any

APPLIED_HASH = "pagoda.dev/applied-hash"

_SUFFIXES = {
    "": 1,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([numkMGTPE]i?|)$")
# Keys whose values the API server canonicalises as resource.Quantity ("0.5" -> "500m").
_QUANTITY_KEYS = {"requests", "limits", "sizeLimit"}


class Action(str, Enum):
    """What to do with one child."""

    NONE = "none"
    CREATE = "create"
    UPDATE = "update"
    REPAIR = "repair"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Plan:
    """The decision for one child and, for a repair, the fields found changed."""

    action: Action
    drifted: tuple[str, ...] = ()


def parse_quantity(text: str) -> Decimal | None:
    """The value of a Kubernetes quantity, or None if it is not one."""
    match = _QUANTITY.match(text.strip())
    if not match or match.group(2) not in _SUFFIXES:
        return None
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation:
        return None


def applied_hash(desired: dict[str, Any]) -> str:
    """A digest of a rendered object, ignoring the annotation that carries it."""
    clean = copy.deepcopy(desired)
    annotations = clean.get("metadata", {}).get("annotations", {})
    annotations.pop(APPLIED_HASH, None)
    if not annotations:
        clean.get("metadata", {}).pop("annotations", None)
    return hashlib.sha256(json.dumps(clean, sort_keys=True).encode()).hexdigest()[:20]


def stamp(desired: dict[str, Any]) -> dict[str, Any]:
    """The object to write: the rendered one plus its applied-hash annotation."""
    stamped = copy.deepcopy(desired)
    stamped["metadata"].setdefault("annotations", {})[APPLIED_HASH] = applied_hash(desired)
    return stamped


def _same_scalar(want: Any, have: Any, quantity: bool) -> bool:
    if want == have:
        return True
    if quantity and isinstance(want, (str, int)) and isinstance(have, (str, int)):
        a, b = parse_quantity(str(want)), parse_quantity(str(have))
        return a is not None and a == b
    return False


def differences(want: Any, have: Any, path: str = "", quantity: bool = False) -> list[str]:
    """Paths where `have` does not hold what `want` says; extra live fields are fine."""
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return [path or "."]
        out: list[str] = []
        for key, value in want.items():
            sub = f"{path}.{key}" if path else key
            if key not in have:
                # The API server drops empty maps and lists, and they mean "unset".
                if value not in ({}, [], None):
                    out.append(sub)
                continue
            out += differences(value, have[key], sub, quantity or key in _QUANTITY_KEYS)
        return out
    if isinstance(want, list):
        if not isinstance(have, list) or len(want) != len(have):
            return [path]
        out = []
        for index, (a, b) in enumerate(zip(want, have)):
            out += differences(a, b, f"{path}[{index}]", quantity)
        return out
    return [] if _same_scalar(want, have, quantity) else [path]


def plan(desired: dict[str, Any], live: dict[str, Any] | None) -> Plan:
    """What one child needs: nothing, creation, an update (spec changed) or a repair."""
    if live is None:
        return Plan(Action.CREATE)
    live_hash = (live.get("metadata", {}).get("annotations") or {}).get(APPLIED_HASH)
    if live_hash != applied_hash(desired):
        return Plan(Action.UPDATE)
    drifted = differences(desired, live)
    if drifted:
        return Plan(Action.REPAIR, tuple(drifted))
    return Plan(Action.NONE)
