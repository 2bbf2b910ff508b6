"""A CRD's `x-kubernetes-validations` rules, evaluated with cel-python (pure).

The API server evaluates each rule with `self` bound to the value at the
rule's place in the schema, at every level (objects, list items, map
values), skipping absent values. A transition rule (one that reads `oldSelf`)
runs only on an update and only where the old object has a value at the same
place: through object fields and the items of `x-kubernetes-list-type: map`
lists, found by their keys (atomic lists have no old items). With validation
ratcheting (on by default since Kubernetes 1.30) a rule without `oldSelf`
is skipped where an update left the value unchanged.

At the root, `self.metadata` holds only `name` and `generateName`, as on a
real server. celpy provides the CEL standard library the CRD uses (`has()`,
`matches` with RE2, `startsWith`, `size`, `type()`, `all`, `exists_one`...).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import celpy
from kubesim.errors import Cause
from kubesim.openapi import (
    Schema,
    child_schema,
    list_map_keys,
    matching_item,
    render_path,
    type_name,
)

Path = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Rule:
    """One compiled `x-kubernetes-validations` entry."""

    rule: str
    message: str | None
    message_expression: str | None
    field_path: str | None
    reason: str
    program: Any  # celpy.Runner

    @property
    def is_transition(self) -> bool:
        """Whether the rule reads `oldSelf` (runs only on updates with an old value)."""
        return "oldSelf" in self.rule


_ENV = celpy.Environment()


@functools.lru_cache(maxsize=512)
def compile_rule(text: str) -> Any:
    """A CEL expression compiled once (parsing is the slow part)."""
    return _ENV.program(_ENV.compile(text))


def rules_of(schema: Schema) -> list[Rule]:
    """The compiled rules declared at one node of a schema (raises on a rule that does not compile)."""
    return [
        Rule(
            rule=entry["rule"],
            message=entry.get("message"),
            message_expression=entry.get("messageExpression"),
            field_path=entry.get("fieldPath"),
            reason=entry.get("reason", "FieldValueInvalid"),
            program=compile_rule(entry["rule"]),
        )
        for entry in schema.get("x-kubernetes-validations") or []
    ]


def walk_rules(schema: Schema, path: Path = ()) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every rule of a schema with the schema path it sits at (`[]` for list items)."""
    for entry in schema.get("x-kubernetes-validations") or []:
        yield path, entry
    for key, sub in (schema.get("properties") or {}).items():
        yield from walk_rules(sub, (*path, key))
    if isinstance(schema.get("items"), dict):
        yield from walk_rules(schema["items"], (*path, "[]"))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk_rules(schema["additionalProperties"], (*path, "{}"))


def typed(value: Any, schema: Schema) -> Any:
    """A JSON value with the CEL types its schema gives it.

    A `type: number` value is a double even when written as an integer, as
    the API server converts it (so `type(self) == double` holds).
    """
    if isinstance(value, dict):
        return {k: typed(v, child_schema(schema, k) or {}) for k, v in value.items()}
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [typed(item, items) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and schema.get("type") == "number":
        return float(value)
    return value


def _root_view(obj: dict[str, Any], schema: Schema) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "generateName") if k in meta}
    return typed({**obj, "metadata": kept}, schema)


def evaluate(
    schema: Schema,
    new: dict[str, Any],
    old: dict[str, Any] | None,
    evaluated: set[str] | None = None,
) -> list[tuple[Path, Cause]]:
    """The rules `new` breaks, with the path of the value each is about.

    `old` is the stored object on an update (None on create). Rules that ran
    are added to `evaluated` (their text), for tests that want every rule run.
    """
    found: list[tuple[Path, Cause]] = []
    before = _root_view(old, schema) if old else None
    _walk(schema, _root_view(new, schema), before, old is not None, (), found, evaluated)
    return found


def _walk(
    schema: Schema,
    new: Any,
    old: Any,
    has_old: bool,
    path: Path,
    found: list[tuple[Path, Cause]],
    evaluated: set[str] | None,
) -> None:
    if new is None:
        return
    for rule in rules_of(schema):
        if rule.is_transition and not has_old:
            continue
        if has_old and not rule.is_transition and old == new:
            continue  # ratcheting: an unchanged value is not re-validated
        if evaluated is not None:
            evaluated.add(rule.rule)
        cause = _check(rule, new, old, path)
        if cause is not None:
            found.append((path, cause))
    if isinstance(new, dict):
        for key, value in new.items():
            sub = child_schema(schema, key)
            if sub is None or (not path and key == "metadata"):
                continue
            known = has_old and isinstance(old, dict) and key in old
            _walk(
                sub, value, old.get(key) if known else None, known, (*path, key), found, evaluated
            )
    elif isinstance(new, list) and isinstance(schema.get("items"), dict):
        keys = list_map_keys(schema)
        for index, item in enumerate(new):
            before = matching_item(old, item, keys) if has_old and keys else None
            _walk(
                schema["items"], item, before, before is not None, (*path, index), found, evaluated
            )


def _check(rule: Rule, new: Any, old: Any, path: Path) -> Cause | None:
    activation = {"self": celpy.json_to_cel(new)}
    if rule.is_transition:
        activation["oldSelf"] = celpy.json_to_cel(old)
    field = render_path(path)
    if rule.field_path:
        field = (field + rule.field_path) if field else rule.field_path.lstrip(".")
    try:
        result = rule.program.evaluate(activation)
    except Exception as e:  # celpy's evaluation errors: a missing key, a type mismatch
        detail = f"{e.args[0] if e.args else e} evaluating rule: {rule.rule}"
        return Cause("FieldValueInvalid", field, f'Invalid value: "{type_name(new)}": {detail}')
    if result is True or (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
        return None
    message = rule.message or f"failed rule: {rule.rule}"
    if rule.message_expression:
        try:
            expressed = compile_rule(rule.message_expression).evaluate(activation)
            if isinstance(expressed, str) and expressed:
                message = str(expressed)
        except Exception:  # the API server falls back to `message` too
            pass
    if rule.reason == "FieldValueRequired":
        return Cause(rule.reason, field, f"Required value: {message}")
    if rule.reason == "FieldValueForbidden":
        return Cause(rule.reason, field, f"Forbidden: {message}")
    return Cause(rule.reason, field, f'Invalid value: "{type_name(new)}": {message}')
