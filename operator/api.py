"""The operator's one door to the Kubernetes API: the official client, off the event loop.

kopf talks to the API for its own needs: watching, the LLMService's finalizer,
Events. Everything else goes through `KubeApi`: reading, applying and deleting
the children, listing pods and EndpointSlices, checking referenced Secrets and
claims, writing the LLMService's status, asking the server's version.

It uses the official `kubernetes` client, which reads bodies however the API
server frames them (a real one sends bodies over ~2 KiB chunked, without
Content-Length), and which handles in-cluster service-account tokens and their
rotation, kubeconfig exec plugins and proxies. The client is synchronous, so
every call runs on a small thread pool and kopf's event loop never waits on
the network. Bodies are read as plain JSON dicts, never as the client's typed
models, so a field a newer API server adds is neither dropped nor an error.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kopf
import kubernetes.client
import kubernetes.config
import urllib3
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from pagoda.operator.errors import ApiError
from pagoda.operator.model import API_VERSION, GROUP, KIND, PLURAL, VERSION

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# (connect, read) seconds: a hung connection must not hold a reconcile forever.
TIMEOUT = (10, 60)


@dataclass(frozen=True, slots=True)
class Kind:
    """How the typed client addresses one namespaced kind."""

    api_version: str
    plural: str
    api: str  # the client class, e.g. AppsV1Api
    snake: str  # the method stem: read_namespaced_<snake>


KINDS: dict[str, Kind] = {
    "ConfigMap": Kind("v1", "configmaps", "CoreV1Api", "config_map"),
    "Service": Kind("v1", "services", "CoreV1Api", "service"),
    "Secret": Kind("v1", "secrets", "CoreV1Api", "secret"),
    "PersistentVolumeClaim": Kind(
        "v1", "persistentvolumeclaims", "CoreV1Api", "persistent_volume_claim"
    ),
    "Pod": Kind("v1", "pods", "CoreV1Api", "pod"),
    "Deployment": Kind("apps/v1", "deployments", "AppsV1Api", "deployment"),
    "PodDisruptionBudget": Kind(
        "policy/v1", "poddisruptionbudgets", "PolicyV1Api", "pod_disruption_budget"
    ),
    "EndpointSlice": Kind(
        "discovery.k8s.io/v1", "endpointslices", "DiscoveryV1Api", "endpoint_slice"
    ),
    "Lease": Kind("coordination.k8s.io/v1", "leases", "CoordinationV1Api", "lease"),
}


# Kinds of other projects' CRDs: (group, version, plural), through CustomObjectsApi.
CUSTOM_KINDS: dict[str, tuple[str, str, str]] = {
    "ScaledObject": ("keda.sh", "v1alpha1", "scaledobjects"),
}


def scale_patch(expected: int, replicas: int) -> list[dict[str, Any]]:
    """A JSON patch (RFC 6902) of an autoscaling/v1 Scale: `replicas`, if it is still `expected`.

    The Scale's `spec.replicas` is omitted when it is 0 (`omitempty` in the
    API's Go type), so the count 0 is tested as an empty spec.
    """
    if expected == 0:
        return [
            {"op": "test", "path": "/spec", "value": {}},
            {"op": "add", "path": "/spec/replicas", "value": replicas},
        ]
    return [
        {"op": "test", "path": "/spec/replicas", "value": expected},
        {"op": "replace", "path": "/spec/replicas", "value": replicas},
    ]


def load_configuration() -> Configuration:
    """Credentials: the pod's service account, else the kubeconfig ($KUBECONFIG)."""
    configuration = Configuration()
    try:
        # try_refresh_token: re-read the projected token as the kubelet rotates it.
        kubernetes.config.load_incluster_config(
            client_configuration=configuration, try_refresh_token=True
        )
    except kubernetes.config.ConfigException:
        # Read $KUBECONFIG now: the client's default is fixed when it is imported.
        kubernetes.config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration
        )
    return configuration


def _status_message(error: ApiException) -> tuple[str, str]:
    """(reason, message) from the Status object in an error's body."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    return str(body.get("reason") or error.reason or ""), str(body.get("message") or "")


def _read_json(response: Any) -> dict[str, Any]:
    try:
        data = response.data
    finally:
        response.release_conn()
    return json.loads(data) if data else {}


class KubeApi:
    """Asynchronous reads and writes through the official client's thread pool."""

    def __init__(self, configuration: Configuration, workers: int = 8) -> None:
        self._configuration = configuration
        self._client = ApiClient(configuration)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="kube-api")
        self._apis: dict[str, Any] = {}

    @classmethod
    def from_environment(cls) -> KubeApi:
        """A client with the credentials of the environment (see `load_configuration`)."""
        return cls(load_configuration())

    def reload(self) -> None:
        """Re-read the credentials (kopf logs in again after a 401)."""
        self._configuration = load_configuration()
        old, self._client = self._client, ApiClient(self._configuration)
        self._apis.clear()
        old.close()

    def close(self) -> None:
        """Release the connection pool and the threads."""
        self._client.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def connection_info(self) -> kopf.ConnectionInfo:
        """The same credentials for kopf's own client: one login serves both."""
        config = self._configuration
        # The client keeps the bearer token under "BearerToken" (36+) or
        # "authorization"; reading it through this method runs the refresh hook
        # of rotating tokens and exec plugins.
        header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix(
            "authorization"
        )
        parts = header.split(" ", 1) if header else []
        scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, header or None)
        return kopf.ConnectionInfo(
            server=config.host,
            ca_path=config.ssl_ca_cert,
            insecure=not config.verify_ssl,
            username=config.username or None,
            password=config.password or None,
            scheme=scheme,
            token=token,
            certificate_path=config.cert_file,
            private_key_path=config.key_file,
        )

    # ---------------------------------------------------------------- plumbing
    def _api(self, name: str) -> Any:
        if name not in self._apis:
            self._apis[name] = getattr(kubernetes.client, name)(self._client)
        return self._apis[name]

    def _method(self, kind: str, verb: str) -> Callable[..., Any]:
        info = KINDS[kind]
        return getattr(self._api(info.api), f"{verb}_namespaced_{info.snake}")

    async def _run(self, call: Callable[[], Any], target: str) -> Any:
        """Run a blocking client call on the pool; translate its errors."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, call)
        except ApiException as e:
            reason, message = _status_message(e)
            raise ApiError(e.status, reason, message, target) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ApiError(None, type(e).__name__, str(e), target) from None

    async def _json(
        self, method: Callable[..., Any], *args: Any, target: str, **kwargs: Any
    ) -> Any:
        call = functools.partial(
            method, *args, _preload_content=False, _request_timeout=TIMEOUT, **kwargs
        )
        return await self._run(lambda: _read_json(call()), target)

    # ---------------------------------------------------------------- children
    def _custom(self, kind: str, verb: str, namespace: str, name: str) -> Callable[..., Any]:
        """A CustomObjectsApi call on one object, its addressing arguments bound."""
        group, version, plural = CUSTOM_KINDS[kind]
        method = getattr(self._api("CustomObjectsApi"), f"{verb}_namespaced_custom_object")
        return functools.partial(method, group, version, namespace, plural, name)

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None if it (or its kind: a CRD not installed) does not exist."""
        target = f"{kind} {namespace}/{name}"
        try:
            if kind in CUSTOM_KINDS:
                return await self._json(self._custom(kind, "get", namespace, name), target=target)
            return await self._json(self._method(kind, "read"), name, namespace, target=target)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(
        self, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """Objects of one kind in one namespace whose labels include `labels`."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        result = await self._json(
            self._method(kind, "list"),
            namespace,
            label_selector=selector,
            target=f"{kind} list {namespace} ({selector})",
        )
        return list(result.get("items") or [])

    async def apply(self, obj: Mapping[str, Any], field_manager: str) -> dict[str, Any]:
        """Server-side apply, forced: the fields in `obj` become this manager's.

        Fields the manager applied before and no longer sends are removed; list
        entries and fields that other managers own are left alone. The API
        server creates the object if it does not exist, and an apply that
        changes nothing does not change the object (nor its resourceVersion).
        """
        meta = obj["metadata"]
        if obj["kind"] in CUSTOM_KINDS:
            return await self._json(
                self._custom(obj["kind"], "patch", meta["namespace"], meta["name"]),
                dict(obj),
                field_manager=field_manager,
                force=True,
                _content_type=APPLY_PATCH,
                target=f"{obj['kind']} {meta['namespace']}/{meta['name']}",
            )
        return await self._json(
            self._method(obj["kind"], "patch"),
            meta["name"],
            meta["namespace"],
            dict(obj),
            field_manager=field_manager,
            force=True,
            _content_type=APPLY_PATCH,
            target=f"{obj['kind']} {meta['namespace']}/{meta['name']}",
        )

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create the object (409 AlreadyExists if it does); returns it as stored."""
        meta = obj["metadata"]
        return await self._json(
            self._method(obj["kind"], "create"),
            meta["namespace"],
            dict(obj),
            target=f"{obj['kind']} {meta['namespace']}/{meta['name']}",
        )

    async def replace(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Update the whole object (PUT); returns it as stored.

        With `metadata.resourceVersion` set, the API server refuses the write
        (409 Conflict) if the object changed since that version was read.
        """
        meta = obj["metadata"]
        return await self._json(
            self._method(obj["kind"], "replace"),
            meta["name"],
            meta["namespace"],
            dict(obj),
            target=f"{obj['kind']} {meta['namespace']}/{meta['name']}",
        )

    async def delete(
        self, kind: str, namespace: str, name: str, uid: str, resource_version: str | None
    ) -> bool:
        """Delete exactly the object that was checked (uid and version preconditions).

        False if it was already gone. A 409 means it changed after the check:
        the caller looks again on the next pass.
        """
        options = kubernetes.client.V1DeleteOptions(
            preconditions=kubernetes.client.V1Preconditions(
                uid=uid, resource_version=resource_version
            ),
            propagation_policy="Background",
        )
        target = f"{kind} {namespace}/{name}"
        try:
            if kind in CUSTOM_KINDS:
                call = self._custom(kind, "delete", namespace, name)
                await self._json(call, body=options, target=target)
            else:
                call = self._method(kind, "delete")
                await self._json(call, name, namespace, body=options, target=target)
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        return True

    # ------------------------------------------------------------- LLMService
    async def _write_status(
        self, namespace: str, name: str, body: Mapping[str, Any], **options: Any
    ) -> None:
        await self._json(
            self._api("CustomObjectsApi").patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            dict(body),
            target=f"LLMService {namespace}/{name} status",
            **options,
        )

    async def patch_status(self, namespace: str, name: str, changes: Mapping[str, Any]) -> None:
        """Merge `changes` into the LLMService's status (the status subresource).

        For the loops' own subtrees (`autoscaling`, `adapters`) and removals
        (a `None` deletes a field whoever wrote it); the sync loop's fields,
        conditions among them, go through `apply_status`.
        """
        await self._write_status(
            namespace, name, {"status": dict(changes)}, _content_type=MERGE_PATCH
        )

    async def apply_status(
        self, namespace: str, name: str, status: Mapping[str, Any], field_manager: str
    ) -> None:
        """Server-side apply of the LLMService's status fields that `field_manager` owns.

        A field the manager stops sending is removed, and other writers'
        fields, conditions of other types included (the CRD keys conditions
        by type), are left alone: a merge patch would replace the whole
        conditions list.
        """
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "status": dict(status),
        }
        await self._write_status(
            namespace,
            name,
            body,
            field_manager=field_manager,
            force=True,
            _content_type=APPLY_PATCH,
        )

    async def get_scale(self, namespace: str, name: str) -> dict[str, Any]:
        """The LLMService's scale subresource (spec.replicas, metadata.resourceVersion)."""
        return await self._json(
            self._api("CustomObjectsApi").get_namespaced_custom_object_scale,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            target=f"LLMService {namespace}/{name} scale",
        )

    async def patch_scale(self, namespace: str, name: str, replicas: int, expected: int) -> None:
        """Set the LLMService's replicas through its scale subresource, as HPA does.

        The write carries a precondition on the count itself (`scale_patch`),
        not on the object's resourceVersion: the operator's own status writes
        change the version every few seconds, and must not make a decision
        fail. If someone else changed the count since it was read, the API
        server refuses the patch with 422 and changes nothing.
        """
        await self._json(
            self._api("CustomObjectsApi").patch_namespaced_custom_object_scale,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            scale_patch(expected, replicas),
            _content_type=JSON_PATCH,
            target=f"LLMService {namespace}/{name} scale",
        )

    async def server_version(self) -> tuple[int, int] | None:
        """(major, minor) of the API server, or None if it does not say."""
        info = await self._json(self._api("VersionApi").get_code, target="version")
        try:
            major, minor = (int(re.sub(r"\D", "", str(info[k]))) for k in ("major", "minor"))
        except (KeyError, ValueError):
            return None
        return major, minor
