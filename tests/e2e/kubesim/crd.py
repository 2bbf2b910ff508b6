"""A CustomResourceDefinition served as kube-apiserver serves it (pure).

`CustomResource.from_file` reads a CRD manifest (the project's real
crds/*.yaml), so the tests check the CRD that ships. On each write the API
server prunes unknown fields, defaults, and validates the object against the
structural schema and its CEL rules: `admit` does the same and returns the
object to store with the causes it breaks (empty when valid). The schema's
`x-kubernetes-list-type: map` lists are also what server-side apply merges
item by item (`list_keys`); every other list of a custom resource is atomic.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubesim import cel, openapi
from kubesim.errors import Cause


@dataclass(frozen=True, slots=True)
class Admission:
    """The object as it will be stored, what pruning dropped, and what it breaks."""

    obj: dict[str, Any]
    pruned: list[str]
    causes: list[Cause]


@dataclass(frozen=True)
class CustomResource:
    """One served version of a CRD: its discovery entry and its schema."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: frozenset[str]
    schema: openapi.Schema = field(repr=False)

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], version: str | None = None) -> CustomResource:
        """The storage version (or `version`) of a CRD manifest."""
        spec = manifest["spec"]
        served = [v for v in spec["versions"] if v.get("served", True)]
        chosen = next(
            v for v in served if (v["name"] == version if version else v.get("storage", False))
        )
        return cls(
            group=spec["group"],
            version=chosen["name"],
            plural=spec["names"]["plural"],
            kind=spec["names"]["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            subresources=frozenset((chosen.get("subresources") or {}).keys()),
            schema=chosen["schema"]["openAPIV3Schema"],
        )

    @classmethod
    def from_file(cls, path: Path) -> CustomResource:
        """A CRD manifest file (YAML)."""
        return cls.from_manifest(yaml.safe_load(path.read_text()))

    @property
    def resource(self) -> str:
        """`group/version/plural`, as kubesim names resources."""
        return f"{self.group}/{self.version}/{self.plural}"

    def discovery(self) -> dict[str, Any]:
        """The entry `resources.declare` gives the server."""
        return {
            "kind": self.kind,
            "namespaced": self.namespaced,
            "subresources": set(self.subresources),
        }

    def admit(self, new: dict[str, Any], old: dict[str, Any] | None) -> Admission:
        """Prune, default and validate a write (`old`: the stored object on an update)."""
        obj = copy.deepcopy(new)
        pruned = openapi.prune(obj, self.schema)
        openapi.apply_defaults(obj, self.schema)
        found = openapi.validate(obj, self.schema) + openapi.duplicate_items(obj, self.schema)
        causes = [
            cause
            for path, cause in found
            if old is None or not openapi.unchanged_along(self.schema, obj, old, path)
        ]
        # As on a real server, a value of the wrong type blocks the CEL rules (they would
        # fail to evaluate); other schema errors are reported together with them.
        if not any(cause.reason == "FieldValueTypeInvalid" for cause in causes):
            causes += [cause for _, cause in cel.evaluate(self.schema, obj, old)]
        return Admission(obj, pruned, causes)

    def list_keys(self, path: tuple[Any, ...], items: list[Any]) -> tuple[str, ...] | None:
        """Server-side apply's keys of the list at `path` (None: an atomic list)."""
        node: openapi.Schema | None = self.schema
        for element in path:
            if node is None:
                return None
            if isinstance(element, str):
                node = openapi.child_schema(node, element)
            else:  # a list item
                node = node.get("items")
        return openapi.list_map_keys(node) if node else None
