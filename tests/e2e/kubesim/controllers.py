"""The controllers of kube-controller-manager that a single-node test cluster needs.

Each is level-based, like the real ones: `sync()` reads the state and writes
what differs, through the API server's HTTP API so that watchers (the
operator) see every change as events. Besides the Deployment controller
(`deployments`) and the ReplicaSet controller (`replicasets`):

* `EndpointSliceController`: one EndpointSlice per Service, with every pod
  that matches the selector, has an IP and has not stopped for good; a
  terminating pod stays, `ready: false`, `serving` its readiness,
  `terminating: true`, until its kubelet has stopped it;
* `GarbageCollector`: background deletion of objects whose owners are gone.
"""

from __future__ import annotations

import logging
from typing import Any

from kubesim.apiserver import APPLY, ApiServer
from kubesim.labels import matches_selector, selector_of
from kubesim.pods import pod_ready, terminal, terminating
from kubesim.testing import ENDPOINTSLICES, PODS, SERVICES, path_of

log = logging.getLogger("kubesim")


async def call(server: ApiServer, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    """One request: (HTTP status, the decoded answer, or its text if it is not JSON)."""
    async with server.request(method, path, **kwargs) as response:
        text = await response.text()
        try:
            body = await response.json(content_type=None)
        except ValueError:
            body = text
        return response.status, body


async def send(server: ApiServer, method: str, path: str, **kwargs: Any) -> Any:
    """One request; None on a 404 or 409 (a race with another writer, looked at again next
    sync) or on a failure (logged)."""
    status, body = await call(server, method, path, **kwargs)
    if status in (404, 409):
        return None
    if status >= 300:
        log.warning("%s %s: %s %s", method, path, status, body)
        return None
    return body


def _target_port(port: dict[str, Any], pods: list[dict[str, Any]]) -> int | None:
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    for pod in pods:
        for container in pod["spec"].get("containers") or []:
            for declared in container.get("ports") or []:
                if declared.get("name") == target:
                    return int(declared["containerPort"])
    return None


def _conditions(pod: dict[str, Any], publish_all: bool) -> dict[str, bool]:
    """An endpoint's conditions (podToEndpoint): a terminating pod may still serve, but is
    never ready, so that only clients that look for terminating endpoints still use it."""
    serving = publish_all or pod_ready(pod)
    ending = terminating(pod)
    return {
        "ready": publish_all or (serving and not ending),
        "serving": serving,
        "terminating": ending,
    }


class EndpointSliceController:
    """Each Service's EndpointSlice: the matching pods that have an address."""

    manager = "endpointslice-controller.k8s.io"

    def __init__(self, server: ApiServer) -> None:
        self.server = server

    async def sync(self) -> None:
        """One pass over every Service."""
        pods = self.server.list_objects(PODS)
        for service in self.server.list_objects(SERVICES):
            selector = (service.get("spec") or {}).get("selector")
            if not selector:
                continue
            meta = service["metadata"]
            chosen = [
                p
                for p in pods
                if p["metadata"]["namespace"] == meta["namespace"]
                and matches_selector(selector_of(selector), p["metadata"].get("labels") or {})
                and (p.get("status") or {}).get("podIP")
                and not terminal(p)
            ]
            await self._write(service, sorted(chosen, key=lambda p: p["metadata"]["name"]))

    async def _write(self, service: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        meta = service["metadata"]
        publish_all = bool(service["spec"].get("publishNotReadyAddresses"))
        endpoints = [
            {
                "addresses": [p["status"]["podIP"]],
                "conditions": _conditions(p, publish_all),
                "targetRef": {
                    "kind": "Pod",
                    "name": p["metadata"]["name"],
                    "namespace": meta["namespace"],
                    "uid": p["metadata"]["uid"],
                },
            }
            for p in pods
        ]
        ports = [
            {"name": port.get("name", ""), "port": target, "protocol": port.get("protocol", "TCP")}
            for port in service["spec"].get("ports") or []
            if (target := _target_port(port, pods)) is not None
        ]
        name = f"{meta['name']}-kubesim"
        endpoint_slice = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                # As the real controller: the Service's labels, then its own.
                "labels": {
                    **(meta.get("labels") or {}),
                    "kubernetes.io/service-name": meta["name"],
                    "endpointslice.kubernetes.io/managed-by": self.manager,
                },
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Service",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": ports,
        }
        # Applied every pass: the API server turns an unchanged one into no write.
        await send(
            self.server,
            "PATCH",
            path_of(ENDPOINTSLICES, meta["namespace"], name),
            json=endpoint_slice,
            headers={"Content-Type": APPLY},
            params={"fieldManager": self.manager, "force": "true"},
        )


class GarbageCollector:
    """Deletes objects all of whose owners are gone (background propagation)."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server

    async def sync(self) -> None:
        """One pass over every object."""
        everything = [
            (resource, obj.raw)
            for (resource, _, _), obj in list(self.server.objects.items())
            if not obj.deleted
        ]
        alive = {raw.get("metadata", {}).get("uid") for _, raw in everything}
        for resource, raw in everything:
            meta = raw.get("metadata") or {}
            refs = meta.get("ownerReferences") or []
            if meta.get("deletionTimestamp"):
                continue  # already on its way out
            if refs and not any(ref.get("uid") in alive for ref in refs):
                resource_path = f"{resource.group}/{resource.version}/{resource.plural}".lstrip("/")
                path = path_of(resource_path, meta.get("namespace"), meta["name"])
                await send(self.server, "DELETE", path)
