"""Label selectors as the API server parses them (pure).

All the forms of `labels.Parse`: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
`a notin (x)`, `a` (exists) and `!a` (does not exist), joined by commas.
A selector that does not parse is a `SelectorError` (the server's 400).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# A qualified name with an optional DNS-subdomain prefix, and a label value (may be empty).
_NAME = r"(?:[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^({_NAME})\s+(in|notin)\s+\(([^()]*)\)$")
_EQUALITY = re.compile(rf"^({_NAME})\s*(==|!=|=)\s*({_VALUE})$")
_EXISTS = re.compile(rf"^(!?)\s*({_NAME})$")
_VALUE_ONLY = re.compile(rf"^{_VALUE}$")


class SelectorError(ValueError):
    """A selector the API server would refuse to parse."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One term of a selector: a key, an operator and its values."""

    key: str
    operator: str  # =, !=, in, notin, exists, !
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether the labels satisfy this term."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "exists":
            return present
        if self.operator == "!":
            return not present
        if self.operator in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # != and notin


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
    return [term.strip() for term in terms]


def parse(selector: str) -> list[Requirement]:
    """The requirements of a selector string (empty: everything matches)."""
    if not (selector or "").strip():
        return []
    requirements = []
    for term in _terms(selector):
        if found := _SET.match(term):
            key, op, raw = found.groups()
            values = [v.strip() for v in raw.split(",")]
            if not all(_VALUE_ONLY.match(v) for v in values):
                raise SelectorError(f"unable to parse requirement: invalid label value in {term!r}")
            requirements.append(Requirement(key, op, frozenset(values)))
        elif found := _EQUALITY.match(term):
            key, op, value = found.groups()
            requirements.append(Requirement(key, "!=" if op == "!=" else "=", frozenset({value})))
        elif found := _EXISTS.match(term):
            bang, key = found.groups()
            requirements.append(Requirement(key, "!" if bang else "exists"))
        else:
            raise SelectorError(f"unable to parse requirement: {term!r}")
    return requirements


def matches_selector(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether labels satisfy a selector string (raises SelectorError if it does not parse)."""
    return all(requirement.matches(labels) for requirement in parse(selector))


def selector_of(match_labels: Mapping[str, str]) -> str:
    """A `matchLabels` map as a selector string."""
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))
