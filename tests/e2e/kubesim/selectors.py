"""What a list or watch asks for: label and field selectors, evaluated on the server (pure).

Field selectors take `field=value`, `field==value` and `field!=value`, joined
by commas, on the fields each resource supports: `metadata.name` and
`metadata.namespace` everywhere, plus a few per kind (a Pod's `status.phase`
and `spec.nodeName`...). Any other field is refused with a 400, as
kube-apiserver answers "field label not supported".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubesim.labels import Requirement, SelectorError, parse

COMMON_FIELDS = ("metadata.name", "metadata.namespace")
# The field selectors of the built-in kinds kubesim serves (the API server's field label conversions).
EXTRA_FIELDS: dict[str, tuple[str, ...]] = {
    "pods": (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "events": (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    "secrets": ("type",),
    "namespaces": ("status.phase",),
    "replicasets": ("status.replicas",),
}


@dataclass(frozen=True, slots=True)
class FieldTerm:
    """One term of a field selector."""

    field: str
    value: str
    negated: bool

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether the object's field (rendered as a string) satisfies the term."""
        node: Any = obj
        for part in self.field.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if isinstance(node, bool):
            node = str(node).lower()
        actual = "" if node is None else str(node)
        return (actual == self.value) != self.negated


def parse_fields(selector: str, plural: str) -> list[FieldTerm]:
    """The terms of a field selector on a resource (raises SelectorError if refused)."""
    terms = []
    supported = COMMON_FIELDS + EXTRA_FIELDS.get(plural, ())
    for raw in (selector or "").split(","):
        if not raw.strip():
            continue
        negated = "!=" in raw
        field, sep, value = raw.partition("!=") if negated else raw.partition("=")
        if not sep:
            raise SelectorError(f"invalid selector: '{selector}'; can't understand '{raw}'")
        field, value = field.strip(), value.removeprefix("=").strip()
        if field not in supported:
            raise SelectorError(f"field label not supported: {field}")
        terms.append(FieldTerm(field, value, negated))
    return terms


@dataclass(frozen=True, slots=True)
class Selection:
    """The selectors of one list or watch request, parsed."""

    labels: list[Requirement]
    fields: list[FieldTerm]

    @classmethod
    def of(cls, params: Mapping[str, str], plural: str) -> Selection:
        """From a request's query (raises SelectorError on a selector the server refuses)."""
        return cls(
            parse(params.get("labelSelector", "")),
            parse_fields(params.get("fieldSelector", ""), plural),
        )

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether an object is selected."""
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(labels) for r in self.labels) and all(
            t.matches(obj) for t in self.fields
        )


__all__ = ["FieldTerm", "Selection", "SelectorError", "parse_fields"]
