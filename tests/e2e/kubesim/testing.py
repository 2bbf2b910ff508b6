"""Helpers for tests that talk to the simulated API server as a user would."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import kmock
from kubesim.apiserver import APPLY, MERGE, ApiServer

NS = "llm"
LLMS = "pagoda.dev/v1alpha1/llmservices"
DEPLOYMENTS = "apps/v1/deployments"
REPLICASETS = "apps/v1/replicasets"
SERVICES = "v1/services"
CONFIGMAPS = "v1/configmaps"
PDBS = "policy/v1/poddisruptionbudgets"
PODS = "v1/pods"
ENDPOINTSLICES = "discovery.k8s.io/v1/endpointslices"

# kind -> resource ("group/version/plural"), for the kinds tests write.
RESOURCE_OF = {
    "LLMService": LLMS,
    "Deployment": DEPLOYMENTS,
    "ReplicaSet": REPLICASETS,
    "Service": SERVICES,
    "ConfigMap": CONFIGMAPS,
    "PodDisruptionBudget": PDBS,
    "Pod": PODS,
    "Secret": "v1/secrets",
    "PersistentVolumeClaim": "v1/persistentvolumeclaims",
    "EndpointSlice": ENDPOINTSLICES,
    "ScaledObject": "keda.sh/v1alpha1/scaledobjects",
}


def path_of(resource: str, namespace: str | None, name: str | None = None) -> str:
    """The URL path of a resource's collection or object."""
    *group_version, plural = resource.split("/")
    prefix = "/api/v1" if group_version == ["v1"] else "/apis/" + "/".join(group_version)
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
    return f"{path}/{name}" if name else path


async def eventually(
    check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05
) -> Any:
    """Poll until `check()` returns a truthy value (or stops raising); fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        error: BaseException | None = None
        try:
            result = check()
            if result:
                return result
        except (KeyError, AssertionError, ValueError, IndexError, TypeError) as e:
            error = e
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s: {error!r}")
        await asyncio.sleep(interval)


@contextlib.contextmanager
def crd_changed(
    server: ApiServer, change: Callable[[dict[str, Any]], None], resource: str = LLMS
) -> Iterator[None]:
    """Serve a changed copy of a CRD's schema meanwhile, then the real one again.

    How a test stores what the real CRD would refuse but a cluster can hold:
    an object created before a rule existed, or fields of a newer CRD.
    """
    key = kmock.resource(resource)
    real = server.custom_resources[key]
    schema = copy.deepcopy(real.schema)
    change(schema)
    server.install(dataclasses.replace(real, schema=schema))
    try:
        yield
    finally:
        server.install(real)


def without_rules(schema: dict[str, Any]) -> None:
    """A `crd_changed` change: drop every CEL rule (an older CRD)."""
    schema.pop("x-kubernetes-validations", None)
    for sub in (schema.get("properties") or {}).values():
        without_rules(sub)
    if isinstance(schema.get("items"), dict):
        without_rules(schema["items"])


def spec_open(schema: dict[str, Any]) -> None:
    """A `crd_changed` change: the spec keeps fields this CRD does not declare (a newer CRD)."""
    schema["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"] = True


def llmservice(name: str = "chat", namespace: str = NS, **spec: Any) -> dict[str, Any]:
    """An LLMService body serving the built-in model, with `spec` fields added."""
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": "smollm2-135m-instruct", **spec},
    }


async def create(server: ApiServer, body: dict[str, Any]) -> dict[str, Any]:
    """POST an object; returns what the server stored."""
    meta = body["metadata"]
    path = path_of(RESOURCE_OF[body["kind"]], meta.get("namespace"))
    async with server.post(path, json=copy.deepcopy(body)) as response:
        assert response.status < 300, await response.text()
        return await response.json()


async def patch(
    server: ApiServer, path: str, body: Any, content_type: str = MERGE, **params: str
) -> dict[str, Any]:
    """PATCH an object (a JSON merge patch by default)."""
    headers = {"Content-Type": content_type}
    async with server.patch(path, json=body, headers=headers, params=params) as response:
        assert response.status < 300, await response.text()
        return await response.json()


async def apply(server: ApiServer, obj: dict[str, Any], manager: str) -> dict[str, Any]:
    """Server-side apply by another field manager (forced, as `kubectl apply --server-side`)."""
    meta = obj["metadata"]
    path = path_of(RESOURCE_OF[obj["kind"]], meta.get("namespace"), meta["name"])
    return await patch(server, path, obj, APPLY, fieldManager=manager, force="true")


async def delete(server: ApiServer, resource: str, name: str, namespace: str = NS) -> None:
    """DELETE an object."""
    async with server.delete(path_of(resource, namespace, name)) as response:
        assert response.status < 300, await response.text()


def obj(server: ApiServer, resource: str, name: str, namespace: str = NS) -> dict[str, Any]:
    """The stored object; raises KeyError if it does not exist."""
    found = server.get_object(resource, namespace, name)
    if found is None:
        raise KeyError(f"{resource} {namespace}/{name}")
    return found


def exists(server: ApiServer, resource: str, name: str, namespace: str = NS) -> bool:
    """Whether the object exists."""
    return server.get_object(resource, namespace, name) is not None


def condition(server: ApiServer, name: str, kind: str, namespace: str = NS) -> dict[str, Any]:
    """One condition of an LLMService's status; KeyError if absent."""
    conditions = (obj(server, LLMS, name, namespace).get("status") or {}).get("conditions") or []
    for found in conditions:
        if found["type"] == kind:
            return found
    raise KeyError(kind)


def events(server: ApiServer, reason: str | None = None) -> list[dict[str, Any]]:
    """Events posted so far (optionally of one reason), oldest first."""
    found = []
    for request in list(server):
        posted = str(request.method.value) == "POST" and request.url.path.endswith("/events")
        data = request.data if posted and isinstance(request.data, dict) else None
        if data is not None and (reason is None or data.get("reason") == reason):
            found.append(data)
    return found


def requests_to(server: ApiServer, method: str, fragment: str) -> list[Any]:
    """Requests of one method whose path contains `fragment`."""
    return [
        r
        for r in list(server)
        if str(r.method.value) == method.upper() and fragment in str(r.url.path)
    ]


def version(server: ApiServer, resource: str, name: str, namespace: str = NS) -> str:
    """An object's resourceVersion."""
    return obj(server, resource, name, namespace)["metadata"]["resourceVersion"]
