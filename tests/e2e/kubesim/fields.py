"""Server-side apply field ownership, reduced to what the tests need (pure).

A real API server tracks, per object, which field manager owns which field
(`metadata.managedFields`). An apply from manager M sets the fields in M's
configuration, takes them from other managers when forced, and removes the
fields M owned before but no longer sends, unless another manager owns them
too. Lists of objects with a merge key (containers by name, env by name...)
are merged item by item, so each item has its own owner; other lists are
atomic. This module models fields as leaf paths and does exactly that.

The merge keys mirror the Kubernetes schemas (`x-kubernetes-list-map-keys`)
for the lists the operator's children use; a list not listed is atomic.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ItemKey:
    """One item of an associative list, by its key fields (`k:{"name":"x"}` in FieldsV1)."""

    fields: tuple[tuple[str, Any], ...]

    def matches(self, item: Any) -> bool:
        """Whether a list item carries these key values."""
        return isinstance(item, dict) and all(
            item.get(name, KEY_DEFAULTS.get(name)) == value for name, value in self.fields
        )


Element = str | ItemKey
Path = tuple[Element, ...]

LIST_MAP_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
    "ownerReferences": ("uid",),
    "conditions": ("type",),
    "topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"),
}
# Key fields the schema defaults, so an item that omits them still matches.
KEY_DEFAULTS = {"protocol": "TCP"}


class ApplyConflict(Exception):
    """An unforced apply would change fields another manager owns (HTTP 409)."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self.paths = sorted(render_path(p) for p in paths)
        super().__init__("conflicts with other field managers: " + ", ".join(self.paths))


def list_keys(field: str | None, items: list[Any]) -> tuple[str, ...] | None:
    """The merge keys of a list field, or None for an atomic list."""
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    if field == "ports":  # containerPort for a container, port for a Service
        return (
            ("containerPort", "protocol") if "containerPort" in items[0] else ("port", "protocol")
        )
    keys = LIST_MAP_KEYS.get(field or "")
    if keys and all(keys[0] in item for item in items):
        return keys
    return None


# The keys of the list at a path (its last element is the list's field name), None if atomic.
ListKeys = Callable[[Path, list[Any]], "tuple[str, ...] | None"]


def builtin_keys(path: Path, items: list[Any]) -> tuple[str, ...] | None:
    """The keys of the built-in types' lists, known by field name (`LIST_MAP_KEYS`)."""
    field = path[-1] if path and isinstance(path[-1], str) else None
    return list_keys(field, items)


def item_key(item: Mapping[str, Any], keys: tuple[str, ...]) -> ItemKey:
    """The key of one associative-list item."""
    return ItemKey(tuple((name, item.get(name, KEY_DEFAULTS.get(name))) for name in keys))


def leaves(value: Any, path: Path = (), keys_of: ListKeys = builtin_keys) -> dict[Path, Any]:
    """Every leaf field of a value: scalars, atomic lists and empty maps, by path."""
    out: dict[Path, Any] = {}
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            out.update(leaves(sub, (*path, key), keys_of))
        return out
    keys = keys_of(path, value) if isinstance(value, list) and value else None
    if keys is not None:
        for item in value:
            out.update(leaves(item, (*path, item_key(item, keys)), keys_of))
        return out
    out[path] = value
    return out


def render_path(path: Path) -> str:
    """A path as people write it: spec.containers[name=runtime].image."""
    text = ""
    for element in path:
        if isinstance(element, ItemKey):
            text += "[" + ",".join(f"{k}={v}" for k, v in element.fields) + "]"
        else:
            text += f".{element}" if text else element
    return text


def _child(node: Any, element: Element) -> Any:
    if isinstance(element, ItemKey):
        if not isinstance(node, list):
            return None
        return next((item for item in node if element.matches(item)), None)
    return node.get(element) if isinstance(node, dict) else None


def get(obj: Any, path: Path) -> Any:
    """The value at a path, or None."""
    node = obj
    for element in path:
        node = _child(node, element)
        if node is None:
            return None
    return node


def set_leaf(node: dict[str, Any], path: Path, value: Any) -> None:
    """Write a leaf, creating the maps and list items on its way."""
    head, rest = path[0], path[1:]
    assert isinstance(head, str), path
    if not rest:
        node[head] = copy.deepcopy(value)
        return
    if isinstance(rest[0], ItemKey):
        items = node.get(head)
        if not isinstance(items, list):
            items = node[head] = []
        item = _child(items, rest[0])
        if item is None:
            item = dict(rest[0].fields)
            items.append(item)
        if len(rest) > 1:
            set_leaf(item, rest[1:], value)
        return
    child = node.get(head)
    if not isinstance(child, dict):
        child = node[head] = {}
    set_leaf(child, rest, value)


def remove_leaf(obj: dict[str, Any], path: Path, kept: Callable[[Path], bool]) -> None:
    """Remove a leaf, then the maps and list items it leaves empty unless `kept(prefix)`."""
    trail: list[tuple[Any, Element, Any]] = []  # (container, element, child) on the way down
    node: Any = obj
    for element in path:
        child = _child(node, element)
        if child is None:
            return
        trail.append((node, element, child))
        node = child
    for depth in range(len(trail) - 1, -1, -1):
        container, element, target = trail[depth]
        if depth < len(trail) - 1:
            # A parent: drop it only when emptied (item keys alone count as empty).
            rest = target
            if isinstance(element, ItemKey) and isinstance(target, dict):
                rest = {k: v for k, v in target.items() if k not in dict(element.fields)}
            if rest or kept(path[: depth + 1]):
                return
        if isinstance(element, ItemKey):
            container[:] = [item for item in container if item is not target]
        else:
            del container[element]


def _is_key(path: Path) -> bool:
    """Whether a leaf is a key field of the list item that holds it."""
    return len(path) >= 2 and isinstance(path[-2], ItemKey) and path[-1] in dict(path[-2].fields)


def _owned_below(owners: Mapping[str, set[Path]]) -> Callable[[Path], bool]:
    def kept(prefix: Path) -> bool:
        return any(p[: len(prefix)] == prefix for paths in owners.values() for p in paths)

    return kept


def apply(
    obj: dict[str, Any],
    config: dict[str, Any],
    manager: str,
    owners: Mapping[str, set[Path]],
    force: bool,
    keys_of: ListKeys = builtin_keys,
) -> tuple[dict[str, Any], dict[str, set[Path]]]:
    """Server-side apply of `config` by `manager`: the new object and owners."""
    wanted = leaves(config, keys_of=keys_of)
    new = copy.deepcopy(obj)
    live = leaves(new, keys_of=keys_of)
    owners = {name: set(paths) for name, paths in owners.items()}
    taken = {p for p, v in wanted.items() if p in live and live[p] != v}
    conflicts = {p for name, paths in owners.items() if name != manager for p in paths & taken}
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    for name in owners:
        if name != manager:
            owners[name] -= taken  # forced: the field changes hands; equal values stay shared
    previous = owners.get(manager, set())
    owners[manager] = set(wanted)
    kept = _owned_below(owners)
    # An item is found by its key fields: remove those last.
    for path in sorted(previous - set(wanted), key=lambda p: (_is_key(p), -len(p))):
        if not kept(path):
            remove_leaf(new, path, kept)
    for path, value in wanted.items():
        set_leaf(new, path, value)
    return new, {name: paths for name, paths in owners.items() if paths}


def update_owners(
    old: dict[str, Any],
    new: dict[str, Any],
    manager: str,
    owners: Mapping[str, set[Path]],
    keys_of: ListKeys = builtin_keys,
) -> dict[str, set[Path]]:
    """Ownership after a non-apply write: the writer owns what it changed."""
    before, after = leaves(old, keys_of=keys_of), leaves(new, keys_of=keys_of)
    changed = {p for p, v in after.items() if p not in before or before[p] != v}
    removed = set(before) - set(after)
    result = {name: set(paths) - changed - removed for name, paths in owners.items()}
    if changed:
        result.setdefault(manager, set()).update(changed)
    return {name: paths for name, paths in result.items() if paths}


def _smd_path(path: Path) -> str:
    """A path as structured-merge-diff prints it: .spec.containers[name="app"].env."""
    text = ""
    for element in path:
        if isinstance(element, ItemKey):
            text += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in element.fields) + "]"
        else:
            text += f".{element}"
    return text


def duplicate_keys(value: Any, keys_of: ListKeys = builtin_keys, path: Path = ()) -> list[str]:
    """The associative lists of an applied configuration that repeat a key.

    Server-side apply cannot type such a configuration: the API server
    answers 500 "failed to create typed patch object" with these lines.
    """
    found: list[str] = []
    if isinstance(value, dict):
        for key, sub in value.items():
            found += duplicate_keys(sub, keys_of, (*path, key))
    elif isinstance(value, list) and value:
        keys = keys_of(path, value)
        if keys is None:
            return found
        seen: set[ItemKey] = set()
        for item in value:
            key = item_key(item, keys)
            if key in seen:
                rendered = ",".join(f"{k}={json.dumps(v)}" for k, v in key.fields)
                found.append(f"{_smd_path(path)}: duplicate entries for key [{rendered}]")
            seen.add(key)
            found += duplicate_keys(item, keys_of, (*path, key))
    return found


def shadowed_env(value: Any, path: str = "") -> list[str]:
    """The API server's warnings for env vars that repeat a name (kept, but apply drops them)."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, sub in value.items():
            where = f"{path}.{key}" if path else key
            if key == "env" and isinstance(sub, list):
                seen: set[Any] = set()
                for index, item in enumerate(sub):
                    name = item.get("name") if isinstance(item, dict) else None
                    if name in seen:
                        found.append(
                            f'{where}[{index}]: hides previous definition of "{name}", '
                            "which may be dropped when using apply"
                        )
                    seen.add(name)
            else:
                found += shadowed_env(sub, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += shadowed_env(item, f"{path}[{index}]")
    return found


def fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    """Paths in the FieldsV1 format of `metadata.managedFields`."""
    root: dict[str, Any] = {}
    for path in sorted(paths, key=render_path):
        node = root
        for element in path:
            if isinstance(element, ItemKey):
                key = "k:" + json.dumps(dict(element.fields), sort_keys=True, separators=(",", ":"))
            else:
                key = f"f:{element}"
            node = node.setdefault(key, {})
    return root
