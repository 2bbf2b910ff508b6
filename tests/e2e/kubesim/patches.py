"""The patch formats of the Kubernetes API, applied to plain dicts (pure).

* JSON merge patch (RFC 7386): maps merge, `null` deletes, lists are replaced;
* strategic merge patch: the same, but lists with a merge key (see
  `fields.LIST_MAP_KEYS`) merge item by item, as kubectl's patches expect;
* JSON patch (RFC 6902): add, remove, replace and test (kopf guards its
  finalizer edits with a `test` of the resourceVersion).
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim.fields import item_key, list_keys


class PatchError(ValueError):
    """A patch that cannot apply (a failed `test`, a missing path)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, field: str | None = None) -> Any:
    """A strategic merge patch without directives ($patch, $retainKeys...)."""
    if isinstance(patch, list) and isinstance(target, list):
        keys = list_keys(field, patch) or list_keys(field, target)
        if keys is None:
            return copy.deepcopy(patch)
        result = copy.deepcopy(target)
        for item in patch:
            key = item_key(item, keys)
            found = next((i for i, old in enumerate(result) if key.matches(old)), None)
            if found is None:
                result.append(copy.deepcopy(item))
            else:
                result[found] = strategic_merge_patch(result[found], item)
        return result
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = strategic_merge_patch(result.get(key), value, key)
    return result


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise PatchError(f"not a JSON pointer: {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError) as e:
            raise PatchError(f"path not found: /{'/'.join(parts)}") from e
    return node


def json_patch(doc: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902, the operations Kubernetes clients use."""
    result = copy.deepcopy(doc)
    for op in operations:
        parts = _pointer(op["path"])
        parent, last = _parent(result, parts), parts[-1]
        kind = op["op"]
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise PatchError(f"test failed at {op['path']}: {current!r} != {op.get('value')!r}")
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            elif last in parent:
                del parent[last]
            else:
                raise PatchError(f"nothing to remove at {op['path']}")
        elif kind in ("add", "replace"):
            value = copy.deepcopy(op["value"])
            if isinstance(parent, list):
                if last == "-":
                    parent.append(value)
                elif kind == "add":
                    parent.insert(int(last), value)
                else:
                    parent[int(last)] = value
            else:
                parent[last] = value
        else:
            raise PatchError(f"unsupported JSON patch operation {kind!r}")
    return result
