"""kmock, plus the API-server behaviour the operator depends on.

kmock 0.8 merges every write into the stored dict, keeps whatever
resourceVersion and uid a client sent, ignores selectors, answers 404 to an
apply of a missing object, treats every subresource as the whole object and
streams watches without versions. A real API server does none of that, and
the operator's correctness depends on the differences. `ApiServer` adds:

* a new resourceVersion for every change and *none* for a write that changes
  nothing (the operator applies on every resync and counts on it); a 409
  Conflict for an update, patch or apply (of the object, /status or /scale)
  that carries a resourceVersion other than the stored one;
* server-assigned uid, creationTimestamp and generation (bumped when
  anything but metadata and status changes);
* the `status` subresource: writes to the object keep its status, writes to
  `/status` change only the status; the `scale` subresource (autoscaling/v1
  Scale, backed by spec.replicas);
* custom resources served from their CRD (`install`): unknown fields pruned
  (a warning, or 400 with fieldValidation=Strict), `default`s applied, the
  structural schema and its CEL rules validated on every write, /status and
  /scale included (422 Invalid with the causes); see `crd`;
* server-side apply with field ownership per manager (`fields.apply`),
  list-map keys from the CRD schema or the built-in types, duplicate keys in
  an applied list refused (500, as the real server does); create-on-apply,
  merge / strategic-merge (built-in types only) / JSON patches, PUT;
* watches from a resourceVersion out of a bounded history (`watches`), 410
  Gone for a version no longer kept, BOOKMARK events, `timeoutSeconds`, and
  `end_watches()` to end them all as a restart does;
* label and field selectors on lists and watches, refused with 400 when they
  do not parse or name an unsupported field; every list and watch request's
  selectors are kept in `watch_requests` for tests;
* delete preconditions (uid, resourceVersion), finalizers, generateName;
* injected failures and delays (`fail()`), to test error handling.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock
import multidict
import yaml
from kubesim import errors, fields, graceful, patches
from kubesim.crd import CustomResource
from kubesim.labels import SelectorError
from kubesim.selectors import Selection
from kubesim.watches import EventLog, Expired

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


@dataclass(frozen=True, slots=True)
class WatchRequest:
    """What one list or watch asked the server for."""

    resource: str  # group/version/plural, as kubesim names resources
    namespace: str | None
    label_selector: str
    field_selector: str
    watch: bool
    resource_version: str  # where a watch starts ("" for now); a list's is ignored


def now() -> str:
    """RFC 3339, as the API server writes timestamps."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def resource_name(resource: Any) -> str:
    """`group/version/plural` (`v1/pods` for the core group)."""
    prefix = f"{resource.group}/" if resource.group else ""
    return f"{prefix}{resource.version}/{resource.plural}"


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


def _answer(
    obj: dict[str, Any], status: int = 200, warnings: list[str] | None = None
) -> aiohttp.web.Response:
    """A JSON answer, with the API server's `Warning: 299` headers."""
    headers = multidict.CIMultiDict(("Warning", f"299 - {json.dumps(w)}") for w in warnings or [])
    return aiohttp.web.json_response(obj, status=status, headers=headers)


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """A kmock emulator that behaves like kube-apiserver where it matters."""

    server_version: tuple[int, int] = (1, 31)
    # How often an idle watch that allows them gets a BOOKMARK.
    bookmark_seconds: float = 5.0
    # Events kept for watches to resume from (etcd's history between compactions).
    history_size: int = 2000
    watch_requests: list[WatchRequest] = attrs.field(factory=list, init=False)
    custom_resources: dict[Any, CustomResource] = attrs.field(factory=dict, init=False)
    history: EventLog = attrs.field(init=False)
    _owners: dict[Key, dict[str, set[fields.Path]]] = attrs.field(factory=dict, init=False)
    _failures: list[Failure] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.history = EventLog(self.history_size)
        # The official client asks for /version/ (kmock serves only /version).
        self.fallback["get /version/"] << self._serve_server_version

    # ----------------------------------------------------------------- test API
    def install(self, crd: CustomResource) -> None:
        """Serve a custom resource with its CRD's schema (discovery: `resources.declare`)."""
        self.custom_resources[kmock.resource(crd.resource)] = crd

    async def end_watches(self, compact: bool = False) -> None:
        """End every open watch, as an API server restart does; `compact`: forget the history too.

        Clients resume from the last version they saw; after a compaction
        that version is gone and they get 410 Gone, then list again.
        """
        if compact:
            self.history.compact()
        await self.history.interrupt()

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
    def _has_subresource(self, resource: Any, name: str) -> bool:
        return resource in self.resources and name in self.resources[resource].subresources

    def _keys_of(self, resource: Any) -> fields.ListKeys:
        crd = self.custom_resources.get(resource)
        return crd.list_keys if crd is not None else fields.builtin_keys

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
        if request.action == kmock.action.CREATE:
            return await self._create(request)
        if request.action == kmock.action.DELETE and request.name is not None:
            return await self._delete(request)
        return await super()._handle(request)

    async def _delete_gracefully(
        self, request: kmock.Request, key: Key, old: dict[str, Any]
    ) -> aiohttp.web.StreamResponse:
        """A pod's DELETE: marked for its kubelet to stop, removed once it has (`graceful`)."""
        grace = graceful.requested_grace(dict(request.params), request.data)
        deletion = graceful.delete_pod(old, grace, datetime.datetime.now(datetime.timezone.utc))
        new = deletion.obj
        if deletion.remove and not new["metadata"].get("finalizers"):
            await self._remove(request.resource, key, new)
            return _answer(new)
        if deletion.changed:
            owners = self._owners.get(key, {})
            new = self._stamp(key, old, new, owners, _manager(request), False)
            await self._store(request.resource, key, old, new)
        return _answer(new)

    def _stored(self, key: Key) -> dict[str, Any] | None:
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def _admit(
        self,
        request: kmock.Request,
        name: str,
        new: dict[str, Any],
        old: dict[str, Any] | None,
        warnings: list[str],
    ) -> dict[str, Any]:
        """The object a custom resource's write stores: pruned, defaulted, validated."""
        crd = self.custom_resources.get(request.resource)
        if crd is None:
            warnings += fields.shadowed_env(new)
            return new
        admission = crd.admit(new, old)
        if admission.causes:
            raise errors.invalid(crd.kind, request.resource, name, admission.causes)
        unknown = [f'unknown field "{path}"' for path in admission.pruned]
        validation = dict(request.params).get("fieldValidation", "Warn")
        if unknown and validation == "Strict":
            raise errors.bad_request("strict decoding error: " + ", ".join(unknown))
        if validation == "Warn":
            warnings += unknown
        return admission.obj

    async def _create(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if not isinstance(request.data, dict):
            raise errors.bad_request("the body of a create must be an object")
        manager, warnings = _manager(request), []
        data = copy.deepcopy(request.data)
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if meta.get("resourceVersion"):
            raise errors.internal("resourceVersion should not be set on objects to be created")
        namespace = request.namespace or meta.get("namespace")
        if namespace:
            meta["namespace"] = namespace
        key: Key = (request.resource, namespace, meta.get("name") or "")
        async with self._lock:
            if self._stored(key) is not None:
                raise kmock.KubernetesError(
                    409,
                    "AlreadyExists",
                    f'{errors.qualified(request.resource)} "{key[2]}" already exists',
                    {"name": key[2], "kind": request.resource.plural},
                )
            crd = self.custom_resources.get(request.resource)
            if crd is not None and "status" in crd.subresources:
                data.pop("status", None)  # set only through /status
            data = self._admit(request, key[2], data, None, warnings)
            meta = data["metadata"]
            # The server names the object's identity; a client's uid is ignored.
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
            meta.pop("managedFields", None)
            owners = fields.update_owners(
                {}, _user_fields(data), manager, {}, self._keys_of(request.resource)
            )
            self._owners[key] = owners
            meta["managedFields"] = self._managed_fields(owners, {manager: "Update"})
            await self._store(request.resource, key, None, data)
        return _answer(data, 201, warnings)

    async def _delete(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        key: Key = (request.resource, request.namespace, request.name or "")
        async with self._lock:
            old = self._stored(key)
            if old is None:
                raise kmock.KubernetesObjectNotFoundError()
            self._check_preconditions(request, old)
            if graceful.applies_to(request.resource):
                return await self._delete_gracefully(request, key, old)
            meta = old.get("metadata", {})
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return _answer(old)
                # Finalizers hold it: deletion is a write that marks it.
                new = copy.deepcopy(old)
                new["metadata"].update(deletionTimestamp=now(), deletionGracePeriodSeconds=0)
                await self._store(request.resource, key, old, new)
                return _answer(new)
            await self._remove(request.resource, key, old)
            return _answer(old)

    def _check_preconditions(self, request: kmock.Request, obj: dict[str, Any]) -> None:
        body = request.data if isinstance(request.data, dict) else {}
        wanted = body.get("preconditions") or {}
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
        replicas = (obj.get("spec") or {}).get("replicas", 0)
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
                "creationTimestamp": meta.get("creationTimestamp"),
            },
            # autoscaling/v1 ScaleSpec.replicas is `omitempty`: 0 is no field.
            "spec": {"replicas": replicas} if replicas else {},
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
                if request.resource in self.custom_resources:
                    raise errors.unsupported_media_type(
                        "the body of the request was in an unknown format - accepted media "
                        f"types include: {JSON_PATCH}, {MERGE}, {APPLY}"
                    )
                return patches.strategic_merge_patch(old or {}, data)
            return patches.merge_patch(old or {}, data)
        except patches.PatchError as e:
            raise kmock.KubernetesError(422, "Invalid", str(e)) from None

    @staticmethod
    def _check_version(resource: Any, name: str, sent: Any, old: dict[str, Any] | None) -> None:
        """A write that names a resourceVersion is conditional on it (optimistic concurrency)."""
        wanted = ((sent or {}).get("metadata") or {}).get("resourceVersion")
        live = ((old or {}).get("metadata") or {}).get("resourceVersion")
        if wanted and old is not None and wanted != live:
            raise errors.conflict(resource, name)

    def _typed_apply_errors(self, request: kmock.Request, config: dict[str, Any]) -> None:
        """An applied configuration must type: no duplicate keys in its associative lists."""
        duplicates = fields.duplicate_keys(config, self._keys_of(request.resource))
        if not duplicates:
            return
        api_version = config.get("apiVersion") or resource_name(request.resource).rsplit("/", 1)[0]
        kind = config.get("kind") or request.resource.plural
        detail = duplicates[0] if len(duplicates) == 1 else "errors:\n  " + "\n  ".join(duplicates)
        raise errors.internal(
            f"failed to create typed patch object ({request.namespace}/{request.name}; "
            f"{api_version}, Kind={kind}): {detail}"
        )

    async def _write(self, request: kmock.Request, method: str) -> aiohttp.web.StreamResponse:
        resource, sub = request.resource, request.subresource
        key: Key = (resource, request.namespace, request.name or "")
        manager, warnings = _manager(request), []
        keys_of = self._keys_of(resource)
        async with self._lock:
            old = self._stored(key)
            is_apply = method == "PATCH" and _content_type(request) == APPLY
            if old is None and not (is_apply and sub is None):
                raise kmock.KubernetesObjectNotFoundError()
            owners = self._owners.get(key, {})
            if sub == "scale":
                scale = self._patched(self._scale_of(old or {}), request, method)
                self._check_version(resource, key[2], scale, old)
                new = copy.deepcopy(old or {})
                new.setdefault("spec", {})["replicas"] = (scale.get("spec") or {}).get(
                    "replicas", 0
                )
            elif is_apply:
                config = request.data if request.data is not None else yaml.safe_load(request.text)
                if not isinstance(config, dict):
                    raise errors.bad_request("apply needs an object")
                self._check_version(resource, key[2], config, old)
                self._typed_apply_errors(request, config)
                force = dict(request.params).get("force") == "true"
                try:
                    new, owners = fields.apply(
                        _user_fields(old or {}),
                        _user_fields(config),
                        manager,
                        owners,
                        force,
                        keys_of,
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
                self._check_version(resource, key[2], new, old)
            new = self._subresource_view(resource, sub, old, new)
            new = self._admit(request, key[2], new, old, warnings)
            if not is_apply:
                owners = fields.update_owners(
                    _user_fields(old or {}), _user_fields(new), manager, owners, keys_of
                )
            unchanged = old is not None and _user_fields(new) == _user_fields(old)
            if unchanged and owners == self._owners.get(key, {}):
                # A write that changes nothing is not a write: no new
                # resourceVersion, no watch event (what the operator relies on).
                return _answer(self._view(old or {}, sub), 200, warnings)
            self._owners[key] = owners
            new = self._stamp(key, old, new, owners, manager, is_apply)
            if old is not None and self._released(new):
                await self._remove(resource, key, new)
            else:
                await self._store(resource, key, old, new)
            return _answer(self._view(new, sub), 201 if old is None else 200, warnings)

    def _view(self, obj: dict[str, Any], sub: str | None) -> dict[str, Any]:
        return self._scale_of(obj) if sub == "scale" else obj

    def _subresource_view(
        self, resource: Any, sub: str | None, old: dict[str, Any] | None, new: dict[str, Any]
    ) -> dict[str, Any]:
        if not self._has_subresource(resource, "status"):
            return new
        if old is None:
            # Created by an apply: the status is set only through /status.
            return {k: v for k, v in new.items() if k != "status"}
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
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            meta["generation"] = 1
        else:
            for name in ("uid", "creationTimestamp", "deletionTimestamp"):
                if old_meta.get(name):
                    meta[name] = old_meta[name]
            generation = old_meta.get("generation") or 1
            changed = _spec_part(_user_fields(new)) != _spec_part(_user_fields(old))
            meta["generation"] = generation + 1 if changed else generation
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

    @staticmethod
    def _released(obj: dict[str, Any]) -> bool:
        """Marked for deletion, no finalizer left and no grace period running: it goes.

        A terminating pod keeps its object while its kubelet stops it (and
        writes its status): the kubelet's own final DELETE removes it.
        """
        meta = obj.get("metadata", {})
        return (
            bool(meta.get("deletionTimestamp"))
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")
        )

    async def _store(
        self, resource: Any, key: Key, old: dict[str, Any] | None, new: dict[str, Any]
    ) -> None:
        """Keep a new version under the next resourceVersion, and tell the watches."""
        version = self.history.next_version()
        new["metadata"]["resourceVersion"] = str(version)
        if key not in self.objects:
            self.objects[key] = new
        elif self.objects[key].deleted:
            self.objects[key].create(new)
        else:
            self.objects[key].history.append(new)
        await self.history.append(resource, "ADDED" if old is None else "MODIFIED", new, version)

    async def _remove(self, resource: Any, key: Key, last: dict[str, Any]) -> None:
        """Delete an object; the DELETED event carries a new resourceVersion."""
        self.objects[key].delete()
        self._owners.pop(key, None)
        version = self.history.next_version()
        last["metadata"]["resourceVersion"] = str(version)
        await self.history.append(resource, "DELETED", last, version)

    # ----------------------------------------------------------------- reading
    def _selection(self, request: kmock.Request, watch: bool) -> Selection:
        """The request's selectors, recorded for tests and parsed (400 if refused)."""
        params = dict(request.params)
        self.watch_requests.append(
            WatchRequest(
                resource_name(request.resource),
                request.namespace,
                params.get("labelSelector", ""),
                params.get("fieldSelector", ""),
                watch,
                params.get("resourceVersion", ""),
            )
        )
        try:
            return Selection.of(params, request.resource.plural)
        except SelectorError as e:
            raise errors.bad_request(str(e)) from None

    def _selected(self, request: kmock.Request, selection: Selection) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(obj.raw)
            for (resource, namespace, name), obj in list(self.objects.items())
            if resource == request.resource
            and not obj.deleted
            and (request.namespace is None or namespace == request.namespace)
            and (request.name is None or name == request.name)
            and selection.matches(obj.raw)
        ]

    def _check_known(self, request: kmock.Request) -> None:
        if request.resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()

    async def _serve_list(self, request: kmock.Request) -> Any:
        self._check_known(request)
        selection = self._selection(request, watch=False)
        async with self._lock:
            items = self._selected(request, selection)
            version = self.history.last
        return {"metadata": {"resourceVersion": str(version)}, "items": items}

    async def _serve_watch(self, request: kmock.Request) -> Any:
        # Everything that can refuse the watch runs before the first chunk: a 400, not a stream.
        self._check_known(request)
        selection = self._selection(request, watch=True)
        params = dict(request.params)
        since = params.get("resourceVersion") or "0"
        if not since.isdigit():
            raise errors.bad_request(f"invalid resource version: {since!r}")
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        bookmarks = params.get("allowWatchBookmarks") == "true"
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        epoch = self.history.epoch
        yield b""

        version = int(since)
        if version == 0:
            # No version: the current state as ADDED events, then the changes after it.
            async with self._lock:
                current = self._selected(request, selection)
                version = self.history.last
            for obj in current:
                yield {"type": "ADDED", "object": obj}
            if params.get("sendInitialEvents") == "true" and bookmarks:
                yield self._bookmark(request, version, initial_events_end=True)
        last_sent = loop.time()
        while True:
            try:
                events = self.history.since(version)
            except Expired as e:
                yield {"type": "ERROR", "object": errors.expired(str(e))}
                return
            for event in events:
                version = event.version
                if event.resource == request.resource and self._watched(
                    request, selection, event.object
                ):
                    last_sent = loop.time()
                    yield {"type": event.type, "object": event.object}
            if deadline is not None and loop.time() >= deadline:
                return  # the server ends the watch; the client resumes from its last version
            wait = None if deadline is None else deadline - loop.time()
            if bookmarks:
                until_bookmark = max(0.0, last_sent + self.bookmark_seconds - loop.time())
                wait = until_bookmark if wait is None else min(wait, until_bookmark)
            await self.history.wait(version, wait)
            if self.history.epoch != epoch:
                return  # ended by the server (`end_watches`)
            idle = self.history.newest <= version  # only an idle watch needs a bookmark
            if bookmarks and idle and loop.time() - last_sent >= self.bookmark_seconds:
                last_sent = loop.time()
                yield self._bookmark(request, version)

    @staticmethod
    def _watched(request: kmock.Request, selection: Selection, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return (
            (request.namespace is None or meta.get("namespace") == request.namespace)
            and (request.name is None or meta.get("name") == request.name)
            and selection.matches(obj)
        )

    def _bookmark(
        self, request: kmock.Request, version: int, initial_events_end: bool = False
    ) -> dict[str, Any]:
        info = self.resources.get(request.resource)
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        if initial_events_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": getattr(info, "kind", None) or request.resource.plural,
                "apiVersion": resource_name(request.resource).rsplit("/", 1)[0],
                "metadata": meta,
            },
        }
