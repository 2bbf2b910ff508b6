"""The admin Secret: the key of the runtime pods' admin port, shared by the pods
(`PAGODA_ADMIN_KEY`) and the operator (`Authorization: Bearer`).

The key is random, made once and then kept: the renderer takes it as an
argument, and the reconcile passes the live Secret's own value back (or a new
one when there is none), so every server-side apply writes the value already
there and changes nothing. A key changed on every apply would lock the
operator out of every running pod, which read it once, at start.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from typing import Any

from pagoda.operator.llmservice import LLMService
from pagoda.operator.render.labels import admin_secret_name, metadata

ADMIN_KEY_FIELD = "token"


def new_admin_key() -> str:
    """A fresh key: 256 random bits, URL-safe (it travels in an HTTP header)."""
    return secrets.token_urlsafe(32)


def admin_key_of(secret: Mapping[str, Any] | None) -> str | None:
    """The key an admin Secret holds (None: no Secret, or no usable key in it)."""
    encoded = ((secret or {}).get("data") or {}).get(ADMIN_KEY_FIELD)
    if not encoded:
        return None
    try:
        key = base64.b64decode(encoded, validate=True).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return None
    return key or None


def render_admin_secret(llms: LLMService, key: str) -> dict[str, Any]:
    """The Secret `NAME-admin` holding `key` (as `data`, never `stringData`:
    the API server turns stringData into data, so an apply of it would never
    match what it reads back)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(llms, admin_secret_name(llms)),
        "type": "Opaque",
        "data": {ADMIN_KEY_FIELD: base64.b64encode(key.encode()).decode()},
    }
