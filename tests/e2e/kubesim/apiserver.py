"""kmock, plus the API-server behaviour the operator depends on.

kmock 0.8 merges every write into the stored dict, keeps whatever
resourceVersion a client sent, ignores label selectors, answers 404 to an
apply of a missing object and treats every subresource as the whole object.
A real API server does none of that, and the operator's correctness depends
on the differences. `ApiServer` adds, per write:

* a new resourceVersion for every change and *none* for a write that changes
  nothing (the operator applies on every resync and counts on it);
* `metadata.generation` bumped when anything but metadata and status changes;
* the `status` subresource: writes to the object keep its status, writes to
  `/status` change only the status; the `scale` subresource of a resource
  declared with it (autoscaling/v1 Scale, backed by spec.replicas);
* server-side apply with field ownership per manager (`fields.apply`),
  create-on-apply, merge / strategic-merge / JSON patches, PUT;
* label selectors on lists and watches, delete preconditions (uid,
  resourceVersion), generateName, uid and creationTimestamp;
* injected failures and delays (`fail()`), to test error handling.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from kubesim import fields, graceful, patches
from kubesim.labels import matches_selector

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# Set by the server, never owned by a field manager.
SERVER_FIELDS = ("resourceVersion", "generation", "uid", "creationTimestamp", "managedFields")

Key = tuple[Any, str | None, str]


@dataclass(slots=True)
class Failure:
    """An injected answer: requests matching method and path fail or wait."""

    method: str
    path: re.Pattern[str]
    status: int | None
    delay: float
    times: int | None
    reason: str
    message: str

    def matches(self, request: kmock.Request) -> bool:
        """Whether this failure applies to the request (and has uses left)."""
        method = str(request.method.value if request.method else "").upper()
        return (
            (self.times is None or self.times > 0)
            and self.method in ("*", method)
            and bool(self.path.search(str(request.url.path)))
        )


def now() -> str:
    """RFC 3339, as the API server writes timestamps."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _content_type(request: kmock.Request) -> str:
    headers = {k.lower(): v for k, v in dict(request.headers).items()}
    return headers.get("content-type", "").split(";")[0].strip()


def _manager(request: kmock.Request) -> str:
    manager = dict(request.params).get("fieldManager")
    if manager:
        return manager
    # As the API server does: the user agent's program name.
    agent = {k.lower(): v for k, v in dict(request.headers).items()}.get("user-agent", "unknown")
    return agent.split("/")[0].split(" ")[0] or "unknown"


def _user_fields(obj: dict[str, Any]) -> dict[str, Any]:
    clean = copy.deepcopy(obj)
    meta = clean.get("metadata") or {}
    for name in SERVER_FIELDS:
        meta.pop(name, None)
    return clean


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """A kmock emulator that behaves like kube-apiserver where it matters."""

    server_version: tuple[int, int] = (1, 31)
    _owners: dict[Key, dict[str, set[fields.Path]]] = attrs.field(factory=dict, init=False)
    _failures: list[Failure] = attrs.field(factory=list, init=False)
    _counter: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)
    _last_version: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # The official client asks for /version/ (kmock serves only /version).
        self.fallback["get /version/"] << self._serve_server_version

    # ----------------------------------------------------------------- test API
    def fail(
        self,
        method: str,
        path: str,
        status: int | None = None,
        *,
        delay: float = 0.0,
        times: int | None = None,
        reason: str = "Injected",
        message: str = "injected by the test",
    ) -> Failure:
        """Make matching requests wait `delay` s, then fail with `status` (None: succeed)."""
        failure = Failure(method.upper(), re.compile(path), status, delay, times, reason, message)
        self._failures.append(failure)
        return failure

    def clear_failures(self) -> None:
        """Serve normally again."""
        self._failures.clear()

    def get_object(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The stored object (a copy), or None."""
        try:
            found = self.objects[resource, namespace, name]
        except KeyError:
            return None
        return None if found.deleted else copy.deepcopy(found.raw)

    def list_objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Stored objects of one resource (copies), optionally of one namespace."""
        wanted = kmock.resource(resource)
        return [
            copy.deepcopy(obj.raw)
            for (res, ns, _), obj in list(self.objects.items())
            if res == wanted and not obj.deleted and (namespace is None or ns == namespace)
        ]

    def owners_of(self, resource: str, namespace: str | None, name: str) -> dict[str, list[str]]:
        """Field manager -> the fields it owns, as readable paths."""
        key = (kmock.resource(resource), namespace, name)
        return {
            manager: sorted(fields.render_path(p) for p in paths)
            for manager, paths in self._owners.get(key, {}).items()
        }

    # ----------------------------------------------------------------- serving
    def _version(self) -> str:
        self._last_version = next(self._counter)
        return str(self._last_version)

    def _has_subresource(self, resource: Any, name: str) -> bool:
        return resource in self.resources and name in self.resources[resource].subresources

    async def _serve_server_version(self, request: kmock.Request) -> dict[str, Any]:
        major, minor = self.server_version
        return {"major": str(major), "minor": str(minor), "gitVersion": f"v{major}.{minor}.0"}

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.resource is None:
            return await super()._handle(request)
        for failure in list(self._failures):
            if failure.matches(request):
                if failure.times is not None:
                    failure.times -= 1
                if failure.delay:
                    await asyncio.sleep(failure.delay)
                if failure.status is not None:
                    raise kmock.KubernetesError(failure.status, failure.reason, failure.message)
        method = str(request.method.value if request.method else "").upper()
        if request.name is not None and method in ("PATCH", "PUT"):
            return await self._write(request, method)
        if request.action == kmock.action.FETCH and request.subresource == "scale":
            obj = self._stored((request.resource, request.namespace, request.name))
            if obj is None:
                raise kmock.KubernetesObjectNotFoundError()
            return aiohttp.web.json_response(self._scale_of(obj))
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            self._prepare_create(request.data, _manager(request), request)
        if request.action == kmock.action.DELETE and request.name is not None:
            self._check_preconditions(request)
            if graceful.applies_to(request.resource):
                return await self._delete_gracefully(request)
        return await super()._handle(request)

    async def _delete_gracefully(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """A pod's DELETE: marked for its kubelet to stop, removed once it has (`graceful`)."""
        key: Key = (request.resource, request.namespace, request.name or "")
        async with self._lock:
            old = self._stored(key)
            if old is None:
                raise kmock.KubernetesObjectNotFoundError()
            grace = graceful.requested_grace(dict(request.params), request.data)
            now = datetime.datetime.now(datetime.timezone.utc)
            deletion = graceful.delete_pod(old, grace, now)
            new = deletion.obj
            if deletion.changed:
                owners = self._owners.get(key, {})
                new = self._stamp(request.resource, key, old, new, owners, _manager(request), False)
            if deletion.remove and not new["metadata"].get("finalizers"):
                self.objects[key].delete()
                self._owners.pop(key, None)
                await self._buses[request.resource].put({"type": "DELETED", "object": new})
            elif deletion.changed:
                await self._store(request.resource, key, old, new)
            return aiohttp.web.json_response(new)

    def _stored(self, key: Key) -> dict[str, Any] | None:
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def _prepare_create(self, data: dict[str, Any], manager: str, request: kmock.Request) -> None:
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta.setdefault("namespace", request.namespace)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        meta["generation"] = 1
        meta["resourceVersion"] = self._version()
        key = (request.resource, meta.get("namespace") or request.namespace, meta["name"])
        if self._stored(key) is not None:
            return  # kmock answers 409 Conflict
        owners = fields.update_owners({}, _user_fields(data), manager, {})
        self._owners[key] = owners
        meta["managedFields"] = self._managed_fields(owners, {manager: "Update"})

    def _check_preconditions(self, request: kmock.Request) -> None:
        body = request.data if isinstance(request.data, dict) else {}
        wanted = body.get("preconditions") or {}
        obj = self._stored((request.resource, request.namespace, request.name))
        if obj is None or not wanted:
            return
        meta = obj.get("metadata", {})
        for field, live in (
            ("uid", meta.get("uid")),
            ("resourceVersion", meta.get("resourceVersion")),
        ):
            if wanted.get(field) not in (None, live):
                raise kmock.KubernetesError(
                    409,
                    "Conflict",
                    f"Precondition failed: {field} in precondition: {wanted[field]}, "
                    f"{field} in object meta: {live}",
                )

    def _scale_of(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata", {})
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 0)},
            "status": {
                "replicas": (obj.get("status") or {}).get("replicas", 0),
                "selector": (obj.get("status") or {}).get("selector", ""),
            },
        }

    def _patched(self, old: dict[str, Any] | None, request: kmock.Request, method: str) -> Any:
        """The object after the request's patch; apply is handled by the caller."""
        data = request.data
        if data is None and request.text:
            data = yaml.safe_load(request.text)
        if method == "PUT":
            return copy.deepcopy(data)
        ctype = _content_type(request)
        try:
            if ctype == JSON_PATCH or isinstance(data, list):
                return patches.json_patch(old or {}, data)
            if ctype == STRATEGIC:
                return patches.strategic_merge_patch(old or {}, data)
            return patches.merge_patch(old or {}, data)
        except patches.PatchError as e:
            raise kmock.KubernetesError(422, "Invalid", str(e)) from None

    async def _write(self, request: kmock.Request, method: str) -> aiohttp.web.StreamResponse:
        resource, sub = request.resource, request.subresource
        key: Key = (resource, request.namespace, request.name or "")
        manager = _manager(request)
        async with self._lock:
            old = self._stored(key)
            is_apply = method == "PATCH" and _content_type(request) == APPLY
            if old is None and not (is_apply and sub is None):
                raise kmock.KubernetesObjectNotFoundError()
            owners = self._owners.get(key, {})
            if sub == "scale":
                scale = self._patched(self._scale_of(old or {}), request, method)
                new = copy.deepcopy(old or {})
                new.setdefault("spec", {})["replicas"] = scale["spec"]["replicas"]
            elif is_apply:
                config = request.data if request.data is not None else yaml.safe_load(request.text)
                if not isinstance(config, dict):
                    raise kmock.KubernetesError(400, "BadRequest", "apply needs an object")
                force = dict(request.params).get("force") == "true"
                try:
                    new, owners = fields.apply(
                        _user_fields(old or {}), _user_fields(config), manager, owners, force
                    )
                except fields.ApplyConflict as e:
                    raise kmock.KubernetesError(409, "Conflict", str(e)) from None
                if old is not None:
                    for name in SERVER_FIELDS:
                        if name in old.get("metadata", {}):
                            new["metadata"][name] = old["metadata"][name]
            else:
                new = self._patched(old, request, method)
                if not isinstance(new, dict):
                    raise kmock.KubernetesError(422, "Invalid", "the result is not an object")
            new = self._subresource_view(resource, sub, old, new)
            if not is_apply:
                owners = fields.update_owners(
                    _user_fields(old or {}), _user_fields(new), manager, owners
                )
            unchanged = old is not None and _user_fields(new) == _user_fields(old)
            if unchanged and owners == self._owners.get(key, {}):
                # A write that changes nothing is not a write: no new
                # resourceVersion, no watch event (what the operator relies on).
                return aiohttp.web.json_response(self._answer(old or {}, sub))
            self._owners[key] = owners
            new = self._stamp(resource, key, old, new, owners, manager, is_apply)
            await self._store(resource, key, old, new)
            return aiohttp.web.json_response(self._answer(new, sub))

    def _answer(self, obj: dict[str, Any], sub: str | None) -> dict[str, Any]:
        return self._scale_of(obj) if sub == "scale" else obj

    def _subresource_view(
        self, resource: Any, sub: str | None, old: dict[str, Any] | None, new: dict[str, Any]
    ) -> dict[str, Any]:
        if old is None or not self._has_subresource(resource, "status"):
            return new
        if sub == "status":
            # Only the status changes through /status.
            return {**copy.deepcopy(old), "status": new.get("status", {})}
        if sub is None:
            # ...and never through the object itself.
            kept = copy.deepcopy(new)
            if "status" in old:
                kept["status"] = copy.deepcopy(old["status"])
            else:
                kept.pop("status", None)
            return kept
        return new

    def _stamp(
        self,
        resource: Any,
        key: Key,
        old: dict[str, Any] | None,
        new: dict[str, Any],
        owners: dict[str, set[fields.Path]],
        manager: str,
        is_apply: bool,
    ) -> dict[str, Any]:
        meta = new.setdefault("metadata", {})
        old_meta = (old or {}).get("metadata", {})
        meta["name"], meta["namespace"] = key[2], key[1]
        if old is None:
            meta["uid"] = meta.get("uid") or str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            meta["generation"] = 1
        else:
            for name in ("uid", "creationTimestamp"):
                meta[name] = old_meta.get(name)
            generation = old_meta.get("generation") or 1
            changed = _spec_part(_user_fields(new)) != _spec_part(_user_fields(old))
            meta["generation"] = generation + 1 if changed else generation
        meta["resourceVersion"] = self._version()
        operations = {
            entry.get("manager"): entry.get("operation")
            for entry in old_meta.get("managedFields") or []
        }
        operations[manager] = "Apply" if is_apply else "Update"
        meta["managedFields"] = self._managed_fields(owners, operations)
        return new

    @staticmethod
    def _managed_fields(
        owners: dict[str, set[fields.Path]], operations: dict[str, str]
    ) -> list[dict[str, Any]]:
        return [
            {
                "manager": manager,
                "operation": operations.get(manager, "Update"),
                "fieldsType": "FieldsV1",
                "fieldsV1": fields.fields_v1(paths),
                "time": now(),
            }
            for manager, paths in sorted(owners.items())
        ]

    async def _store(
        self, resource: Any, key: Key, old: dict[str, Any] | None, new: dict[str, Any]
    ) -> None:
        meta = new.get("metadata", {})
        released = (old or {}).get("metadata", {}).get("finalizers") and not meta.get("finalizers")
        if (
            released
            and meta.get("deletionTimestamp")
            and not meta.get("deletionGracePeriodSeconds")
        ):
            # The last finalizer is gone and no grace period runs: the object goes.
            self.objects[key].delete()
            self._owners.pop(key, None)
            await self._buses[resource].put({"type": "DELETED", "object": new})
            return
        if key not in self.objects:
            self.objects[key] = new
        elif self.objects[key].deleted:
            self.objects[key].create(new)
        else:
            self.objects[key].history.append(new)
        event = "ADDED" if old is None else "MODIFIED"
        await self._buses[resource].put({"type": event, "object": copy.deepcopy(new)})

    # Lists and watches honour labelSelector (kmock ignores it).
    async def _serve_list(self, request: kmock.Request) -> Any:
        result = await super()._serve_list(request)
        keep = self._selector(request)
        result["items"] = [item for item in result["items"] if keep(item)]
        result["metadata"] = {"resourceVersion": str(self._last_version)}
        return result

    async def _serve_watch(self, request: kmock.Request) -> Any:
        keep = self._selector(request)
        async for event in super()._serve_watch(request):
            if isinstance(event, dict) and not keep(event.get("object") or {}):
                continue
            yield event

    @staticmethod
    def _selector(request: kmock.Request) -> Callable[[dict[str, Any]], bool]:
        params = dict(request.params)
        labels_wanted = params.get("labelSelector", "")
        fields_wanted = dict(
            term.split("=", 1) for term in params.get("fieldSelector", "").split(",") if "=" in term
        )

        def keep(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            if not matches_selector(labels_wanted, meta.get("labels") or {}):
                return False
            return all(
                str(meta.get(path.removeprefix("metadata."), "")) == value
                for path, value in fields_wanted.items()
            )

        return keep
