"""A small asynchronous Kubernetes client for the children of an LLMService.

kopf talks to the API for its own needs (watching, patching the LLMService,
posting Events). The operator's writes to *other* objects go through this
client, which reuses the credentials kopf's login produced, so one login
serves both. It knows only the few kinds the operator touches.
"""

from __future__ import annotations

import base64
import json
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf

# kind -> (apiVersion, plural) for everything the operator reads or writes.
KINDS: dict[str, tuple[str, str]] = {
    "ConfigMap": ("v1", "configmaps"),
    "Service": ("v1", "services"),
    "Secret": ("v1", "secrets"),
    "PersistentVolumeClaim": ("v1", "persistentvolumeclaims"),
    "Pod": ("v1", "pods"),
    "Deployment": ("apps/v1", "deployments"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
}


class ApiError(Exception):
    """A non-success answer from the API server."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Target:
    """A namespaced object (name set) or collection (name None) of a known kind."""

    kind: str
    namespace: str
    name: str | None = None

    def path(self) -> str:
        """The object's URL path."""
        api_version, plural = KINDS[self.kind]
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        path = f"{base}/namespaces/{quote(self.namespace)}/{plural}"
        return path if self.name is None else f"{path}/{quote(self.name)}"


def target_of(obj: dict[str, Any]) -> Target:
    """Address a rendered object."""
    meta = obj["metadata"]
    return Target(obj["kind"], meta["namespace"], meta["name"])


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if info.insecure:
        return False
    context = ssl.create_default_context(
        cafile=str(info.ca_path) if info.ca_path else None,
        cadata=_text(info.ca_data),
    )
    if info.certificate_path and info.private_key_path:
        context.load_cert_chain(str(info.certificate_path), str(info.private_key_path))
    return context


def _text(data: str | bytes | None) -> str | None:
    if data is None:
        return None
    raw = data if isinstance(data, bytes) else data.encode()
    # kubeconfig carries base64; kopf passes it through undecoded.
    try:
        return base64.b64decode(raw, validate=True).decode()
    except ValueError:
        return raw.decode()


class Kube:
    """The client: one aiohttp session, re-created whenever kopf logs in anew."""

    def __init__(self) -> None:
        self._info: kopf.ConnectionInfo | None = None
        self._session: aiohttp.ClientSession | None = None

    async def use(self, info: kopf.ConnectionInfo) -> None:
        """Adopt fresh credentials (called from the login handler)."""
        self._info = info
        old, self._session = self._session, None
        if old is not None:
            await old.close()

    async def close(self) -> None:
        """Release the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _ensure_session(self) -> tuple[aiohttp.ClientSession, str]:
        if self._info is None:
            raise RuntimeError("no credentials yet: the login handler has not run")
        info = self._info
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json", "User-Agent": "pagoda-operator"}
            if info.token:
                headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
            auth = None
            if info.username and info.password:
                auth = aiohttp.BasicAuth(info.username, info.password)
            self._session = aiohttp.ClientSession(
                headers=headers,
                auth=auth,
                connector=aiohttp.TCPConnector(ssl=_ssl_context(info)),
                timeout=aiohttp.ClientTimeout(total=60, connect=10),
                trust_env=info.trust_env,
            )
        return self._session, info.server.rstrip("/")

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        session, server = self._ensure_session()
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if body is not None else {}
        async with session.request(
            method, server + path, params=params, data=data, headers=headers
        ) as response:
            if response.status == 404:
                return None
            payload = await response.json(content_type=None) if response.content_length else {}
            if response.status >= 400:
                payload = payload if isinstance(payload, dict) else {}
                raise ApiError(
                    response.status,
                    str(payload.get("reason", response.reason)),
                    str(payload.get("message", "")),
                )
            return payload if isinstance(payload, dict) else {}

    async def get(self, target: Target) -> dict[str, Any] | None:
        """The object, or None if it does not exist."""
        return await self._request("GET", target.path())

    async def list(self, target: Target, label_selector: str) -> list[dict[str, Any]]:
        """Objects of one kind in one namespace, matching a label selector."""
        result = await self._request("GET", target.path(), params={"labelSelector": label_selector})
        wanted = dict(term.split("=", 1) for term in label_selector.split(",") if term)
        # Filtered again here: equality selectors are cheap to check, and a proxy
        # or emulator that ignores labelSelector must not leak other pods in.
        return [
            item
            for item in (result or {}).get("items") or []
            if wanted.items() <= ((item.get("metadata") or {}).get("labels") or {}).items()
        ]

    async def apply(self, obj: dict[str, Any], field_manager: str) -> dict[str, Any]:
        """Server-side apply the fields we own; create the object if it is missing.

        With server-side apply a field we stop rendering is removed on the next
        apply, which a merge patch cannot express. `force` because the operator
        is the owner of these fields: a hand edit is drift to repair.
        """
        target = target_of(obj)
        params = {"fieldManager": field_manager, "force": "true"}
        result = await self._request(
            "PATCH", target.path(), params=params, body=obj,
            content_type="application/apply-patch+yaml",
        )  # fmt: skip
        if result is None:
            # Real API servers create on apply; emulators without that answer 404.
            collection = Target(target.kind, target.namespace)
            result = await self._request(
                "POST", collection.path(), params={"fieldManager": field_manager}, body=obj
            )
        if result is None:
            raise ApiError(404, "NotFound", f"namespace {target.namespace} does not exist")
        return result

    async def delete(self, target: Target) -> bool:
        """Delete the object; False if it was already gone."""
        return await self._request("DELETE", target.path()) is not None
