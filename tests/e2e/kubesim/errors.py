"""The API server's error answers (metav1.Status), worded as kube-apiserver words them.

Clients branch on `code` and `reason` (kopf retries a 409 and restarts a watch
on 410; kubectl prints `message`), so each constructor below reproduces the
real server's answer for one situation, `details.causes` included.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import kmock


@dataclass(frozen=True, slots=True)
class Cause:
    """One invalid field: metav1.StatusCause, as `field.Error` renders it."""

    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotSupported...
    field: str  # spec.replicas, spec.adapters[0].name
    message: str  # without the field: `Invalid value: 3: must be at most 2`

    def render(self) -> str:
        """`field: message`, the line kubectl prints."""
        return f"{self.field}: {self.message}" if self.field else self.message

    def as_dict(self) -> dict[str, str]:
        """The cause in a Status's `details.causes`."""
        return {"reason": self.reason, "message": self.message, "field": self.field}


def go_value(value: Any) -> str:
    """A value as field.Invalid prints it: strings quoted, objects by their type."""
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    if value is None:
        return '"null"'
    return json.dumps(value)


def qualified(resource: Any) -> str:
    """`llmservices.pagoda.dev`, or `pods` for the core group."""
    return f"{resource.plural}.{resource.group}" if resource.group else str(resource.plural)


def conflict(resource: Any, name: str) -> kmock.KubernetesError:
    """409: the write carried a resourceVersion that is no longer the stored one."""
    return kmock.KubernetesError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource)} "{name}": the object has '
        "been modified; please apply your changes to the latest version and try again",
        {"name": name, "group": resource.group, "kind": resource.plural},
    )


def invalid(kind: str, resource: Any, name: str, causes: list[Cause]) -> kmock.KubernetesError:
    """422: the object breaks its schema or validation rules."""
    rendered = [cause.render() for cause in causes]
    summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    group = f".{resource.group}" if resource.group else ""
    return kmock.KubernetesError(
        422,
        "Invalid",
        f'{kind}{group} "{name}" is invalid: {summary}',
        {
            "name": name,
            "group": resource.group,
            "kind": kind,
            "causes": [cause.as_dict() for cause in causes],
        },
    )


def bad_request(message: str) -> kmock.KubernetesError:
    """400: a malformed request (a selector that does not parse, an unknown field when strict)."""
    return kmock.KubernetesError(400, "BadRequest", message, {})


def internal(message: str) -> kmock.KubernetesError:
    """500, as the server answers errors it has no Status for (e.g. an untypable apply)."""
    return kmock.KubernetesError(500, "InternalError", message, {"causes": [{"message": message}]})


def unsupported_media_type(message: str) -> kmock.KubernetesError:
    """415: a patch format the resource does not take."""
    return kmock.KubernetesError(415, "UnsupportedMediaType", message, {})


def expired(message: str) -> dict[str, Any]:
    """The Status of a 410 Gone, as a watch's ERROR event carries it."""
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Expired",
        "code": 410,
    }
