"""Label selectors as the API server parses them (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping

_SET = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _terms(selector: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term.strip() for term in terms if term.strip()]


def matches_selector(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether labels satisfy a selector: `a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x)`."""
    for term in _terms(selector or ""):
        found = _SET.match(term)
        if found:
            key, op, values = found.groups()
            allowed = {v.strip() for v in values.split(",") if v.strip()}
            if (op == "in") != (labels.get(key) in allowed):
                return False
        elif "!=" in term:
            key, value = (part.strip() for part in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (part.strip() for part in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def selector_of(match_labels: Mapping[str, str]) -> str:
    """A `matchLabels` map as a selector string."""
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))
