"""A CRD's structural schema on a write: pruning, defaulting and validation (pure).

kube-apiserver decodes a custom resource, prunes the fields its
`openAPIV3Schema` does not declare, applies the schema's `default`s, then
validates the result against the schema (and its CEL rules, see `cel`).
Validation is jsonschema's: the OpenAPI v3 dialect a CRD uses is JSON Schema
draft 4 (where `exclusiveMinimum` is a boolean flag on `minimum`) plus a few
`x-kubernetes-*` extensions, which `to_json_schema` translates:

* `x-kubernetes-int-or-string: true`: an integer or a string;
* `nullable: true`: null is allowed as well as the declared type;
* `x-kubernetes-preserve-unknown-fields: true`: unknown fields stay (no pruning).

Errors come back as `errors.Cause`s worded as the API server words them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

import jsonschema
from kubesim.errors import Cause, go_value

Schema = dict[str, Any]
# The root's metadata is ObjectMeta, validated and pruned by its own rules, not the CRD's.
ROOT_KEPT = ("apiVersion", "kind", "metadata")
_KEYWORDS = {
    "type", "format", "properties", "additionalProperties", "items", "required", "enum",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "pattern", "minItems", "maxItems", "uniqueItems", "multipleOf", "minProperties",
    "maxProperties", "allOf", "anyOf", "oneOf", "not",
}  # fmt: skip


def child_schema(schema: Schema, key: str) -> Schema | None:
    """The schema of an object's field, or None when the schema does not declare it."""
    properties = schema.get("properties") or {}
    if key in properties:
        return properties[key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def list_map_keys(schema: Schema) -> tuple[str, ...] | None:
    """The key fields of an `x-kubernetes-list-type: map` list, or None for other lists."""
    if schema.get("x-kubernetes-list-type") != "map":
        return None
    return tuple(schema.get("x-kubernetes-list-map-keys") or ())


def matching_item(items: Any, item: Any, keys: tuple[str, ...] | None) -> Any:
    """The item of `items` with the same key values as `item` (None if none or not a map list)."""
    if not keys or not isinstance(items, list) or not isinstance(item, dict):
        return None
    wanted = [item.get(key) for key in keys]
    return next(
        (old for old in items if isinstance(old, dict) and [old.get(k) for k in keys] == wanted),
        None,
    )


def unchanged_along(schema: Schema, new: Any, old: Any, path: tuple[Any, ...]) -> bool:
    """Whether an update left some value on `path` (the root included) as it was.

    The API server's ratcheting: an error below a value the update did not
    change is not reported. Values are followed through object fields and
    map-list items (found by key); atomic list items have no old counterpart.
    """
    for element in (*path, None):
        if old is None:
            return False
        if new == old:
            return True
        if element is None:
            return False
        if isinstance(element, int):
            keys = list_map_keys(schema)
            if not isinstance(new, list) or element >= len(new):
                return False
            new = new[element]
            old = matching_item(old, new, keys)
            schema = schema.get("items") or {}
        else:
            sub = child_schema(schema, element) if isinstance(schema, dict) else None
            schema = sub or {}
            new = new.get(element) if isinstance(new, dict) else None
            old = old.get(element) if isinstance(old, dict) else None
    return False


def duplicate_items(
    value: Any, schema: Schema, path: tuple[Any, ...] = ()
) -> list[tuple[tuple[Any, ...], Cause]]:
    """Items of `x-kubernetes-list-type: map` or `set` lists that repeat a key (or value)."""
    found: list[tuple[tuple[Any, ...], Cause]] = []
    if isinstance(value, dict):
        for key, sub in value.items():
            child = child_schema(schema, key)
            if child is not None and not (not path and key == "metadata"):
                found += duplicate_items(sub, child, (*path, key))
    elif isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        keys, kind = list_map_keys(schema), schema.get("x-kubernetes-list-type")
        seen: list[Any] = []
        for index, item in enumerate(value):
            if kind == "map" and keys and isinstance(item, dict):
                identity: Any = {k: item[k] for k in keys if k in item}
            elif kind == "set":
                identity = item
            else:
                identity = None
            if identity is not None and identity in seen:
                field = render_path((*path, index))
                rendered = json.dumps(identity, separators=(",", ":"))
                found.append(
                    (
                        (*path, index),
                        Cause("FieldValueDuplicate", field, f"Duplicate value: {rendered}"),
                    )
                )
            seen.append(identity)
            found += duplicate_items(item, items, (*path, index))
    return found


def to_json_schema(schema: Schema) -> Schema:
    """The draft-4 JSON Schema that validates what the OpenAPI schema describes."""
    out: Schema = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(sub) for sub in value]
        elif key in _KEYWORDS:
            out[key] = copy.deepcopy(value)
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("allOf", []).append({"anyOf": [{"type": "integer"}, {"type": "string"}]})
    if schema.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def prune(value: Any, schema: Schema, path: str = "", root: bool = True) -> list[str]:
    """Drop, in place, the fields the schema does not declare; returns their paths."""
    dropped: list[str] = []
    if isinstance(value, dict):
        preserve = schema.get("x-kubernetes-preserve-unknown-fields")
        for key in list(value):
            if root and key in ROOT_KEPT:
                continue
            sub = child_schema(schema, key)
            where = f"{path}.{key}" if path else key
            if sub is not None:
                dropped += prune(value[key], sub, where, root=False)
            elif not preserve and schema.get("additionalProperties") is not True:
                del value[key]
                dropped.append(where)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            dropped += prune(item, schema["items"], f"{path}[{index}]", root=False)
    return dropped


def apply_defaults(value: Any, schema: Schema, root: bool = True) -> None:
    """Fill in `default`s in place, as the API server's structural defaulting does.

    A field that is missing, or null where the schema does not allow null,
    gets its default (a copy); then defaulting descends into every field, so
    the fields of an object that was itself just defaulted (`default: {}`)
    get their own defaults too. Nulls that stay non-nullable are dropped.
    """
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if root and key == "metadata":
                continue
            missing = key not in value or (value[key] is None and not sub.get("nullable"))
            if missing and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key in list(value):
            if root and key == "metadata":
                continue
            sub = child_schema(schema, key)
            if sub is None:
                continue
            if value[key] is None and not sub.get("nullable"):
                del value[key]
            else:
                apply_defaults(value[key], sub, root=False)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(item, schema["items"], root=False)


# id(schema) -> (the schema, kept alive so the id stays its own; its validator)
_VALIDATORS: dict[int, tuple[Schema, jsonschema.Draft4Validator]] = {}


def _validator(schema: Schema) -> jsonschema.Draft4Validator:
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = _VALIDATORS[id(schema)] = (
            schema,
            jsonschema.Draft4Validator(to_json_schema(schema)),
        )
    return cached[1]


def render_path(path: Iterable[Any]) -> str:
    """A JSON path as field errors write it: spec.adapters[0].name."""
    text = ""
    for element in path:
        if isinstance(element, int):
            text += f"[{element}]"
        else:
            text += f".{element}" if text else str(element)
    return text


def _cause(error: jsonschema.ValidationError) -> list[Cause]:
    """The API server's wording of one jsonschema error."""
    field = render_path(list(error.absolute_path))
    body = f"{field} in body" if field else "body"
    value, keyword, expected = error.instance, error.validator, error.validator_value
    if keyword == "required":
        missing = [name for name in expected if name not in (value or {})]
        return [
            Cause("FieldValueRequired", f"{field}.{name}" if field else name, "Required value")
            for name in missing
        ]
    if keyword == "enum":
        allowed = ", ".join(go_value(v) for v in expected)
        return [
            Cause(
                "FieldValueNotSupported",
                field,
                f"Unsupported value: {go_value(value)}: supported values: {allowed}",
            )
        ]
    if keyword == "type" or (
        keyword == "anyOf" and error.schema_path and "allOf" in error.schema_path
    ):
        wanted = expected if keyword == "type" else "integer,string"
        if isinstance(wanted, list):
            wanted = ",".join(t for t in wanted if t != "null")
        kind = type_name(value)
        return [
            Cause(
                "FieldValueTypeInvalid",
                field,
                f'Invalid value: "{kind}": {body} must be of type {wanted}: "{kind}"',
            )
        ]
    if keyword == "maxItems":
        return [
            Cause(
                "FieldValueTooMany",
                field,
                f"Too many: {len(value)}: must have at most {expected} items",
            )
        ]
    detail = {
        "minimum": f"should be greater than or equal to {expected}",
        "maximum": f"should be less than or equal to {expected}",
        "minLength": f"should be at least {expected} chars long",
        "maxLength": f"may not be more than {expected} bytes",
        "pattern": f"should match '{expected}'",
        "minItems": f"should have at least {expected} items",
        "uniqueItems": "shouldn't contain duplicates",
        "multipleOf": f"should be a multiple of {expected}",
    }.get(str(keyword), error.message)
    if keyword == "minimum" and error.schema.get("exclusiveMinimum"):
        detail = f"should be greater than {expected}"
    if keyword == "maximum" and error.schema.get("exclusiveMaximum"):
        detail = f"should be less than {expected}"
    return [Cause("FieldValueInvalid", field, f"Invalid value: {go_value(value)}: {body} {detail}")]


def type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), "null")


def validate(obj: dict[str, Any], schema: Schema) -> list[tuple[tuple[Any, ...], Cause]]:
    """The object's schema violations, each with the JSON path of the value it is about.

    metadata is not the CRD's to validate (ObjectMeta has its own rules).
    """
    checked = {key: value for key, value in obj.items() if key != "metadata"}
    errors = _validator(schema).iter_errors(checked)
    found: list[tuple[tuple[Any, ...], Cause]] = []
    for error in sorted(errors, key=lambda e: [str(p) for p in e.absolute_path]):
        found += [(tuple(error.absolute_path), cause) for cause in _cause(error)]
    return found
