"""Check an LLMService offline the way the API server would admit it.

Applies the CRD schema's defaults, validates the OpenAPI schema, then evaluates
every CEL rule (`x-kubernetes-validations`) at its node. Used by the tests to
prove the schema and the pydantic model agree, and by users to lint manifests
without a cluster::

    python -m pagoda.operator.admission examples/*.yaml

Needs `jsonschema` and `cel-python` (the `dev` extra); the operator does not.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pagoda.operator import crd


def root_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the generated CRD."""
    return crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: fill absent properties that have a default, recursively."""
    value = copy.deepcopy(value)
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    if isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


def _openapi_only(schema: Any) -> Any:
    """Drop the x-kubernetes-* extensions so a JSON-schema validator sees plain draft 4."""
    if isinstance(schema, dict):
        return {k: _openapi_only(v) for k, v in schema.items() if not k.startswith("x-")}
    if isinstance(schema, list):
        return [_openapi_only(v) for v in schema]
    return schema


def _nodes(schema: dict[str, Any], value: Any, path: str) -> Iterator[tuple[dict, Any, str]]:
    """Every (schema node, value, path) of a value, depth first."""
    yield schema, value, path
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from _nodes(sub, value[name], f"{path}.{name}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _nodes(schema["items"], item, f"{path}[{index}]")


def _rules(schema: dict[str, Any], value: Any, path: str) -> Iterator[tuple[str, dict, Any]]:
    for node, node_value, node_path in _nodes(schema, value, path):
        for rule in node.get("x-kubernetes-validations", []):
            yield node_path, rule, node_value


def _list_duplicates(schema: dict[str, Any], value: Any, path: str) -> Iterator[str]:
    """Duplicate entries of `map` and `set` lists, as the API server reports them."""
    for node, items, node_path in _nodes(schema, value, path):
        kind = node.get("x-kubernetes-list-type")
        if not isinstance(items, list) or kind not in ("map", "set"):
            continue
        keys = node.get("x-kubernetes-list-map-keys") or []
        seen: set[str] = set()
        for index, item in enumerate(items):
            key = {k: item.get(k) for k in keys} if kind == "map" else item
            text = json.dumps(key, sort_keys=True)
            if text in seen:
                yield f"{node_path.lstrip('.')}[{index}]: Duplicate value: {text}"
            seen.add(text)


def check(body: dict[str, Any]) -> list[str]:
    """Admission errors for one LLMService body (empty: it would be accepted)."""
    import celpy
    import jsonschema

    schema = root_schema()
    body = apply_defaults(schema, body)
    validator = jsonschema.Draft4Validator(_openapi_only(schema))
    errors = [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in validator.iter_errors(body)
    ]
    errors += _list_duplicates(schema, body, "")
    if errors:
        return errors  # the API server stops at schema errors, before CEL
    env = celpy.Environment()
    for path, rule, value in _rules(schema, body, ""):
        program = env.program(env.compile(rule["rule"]))
        try:
            ok = bool(program.evaluate({"self": celpy.json_to_cel(value)}))
        except Exception as e:  # a rule that errors rejects the object too
            ok, rule = False, {**rule, "message": f"{rule['message']} ({e})"}
        if not ok:
            where = (path + rule.get("fieldPath", "")).lstrip(".") or "<root>"
            errors.append(f"{where}: {rule['message']}")
    return errors


def main(argv: list[str] | None = None) -> int:
    """Check every LLMService in the given YAML files; exit 1 on any error."""
    failed = False
    for name in argv if argv is not None else sys.argv[1:]:
        for doc in yaml.safe_load_all(Path(name).read_text()):
            if not doc or doc.get("kind") != "LLMService":
                continue
            for error in check(doc):
                failed = True
                print(f"{name}: {doc['metadata'].get('name')}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
