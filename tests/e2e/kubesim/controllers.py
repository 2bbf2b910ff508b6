"""The controllers of kube-controller-manager that a single-node test cluster needs.

Each is level-based, like the real ones: `sync()` reads the state and writes
what differs, through the API server's HTTP API so that watchers (the
operator) see every change as events. Reduced on purpose:

* `DeploymentController`: Deployments own their pods directly (no ReplicaSet
  objects); pods carry the `pod-template-hash` label; rolling updates honour
  maxSurge and maxUnavailable; the status counts pods, new pods, ready pods.
* `EndpointSliceController`: one EndpointSlice per Service, with every pod
  that matches the selector and has an IP; `ready` is the pod's Ready.
* `GarbageCollector`: background deletion of objects whose owners are gone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import uuid
from typing import Any

from kubesim.apiserver import APPLY, MERGE, ApiServer
from kubesim.labels import matches_selector, selector_of
from kubesim.testing import DEPLOYMENTS, ENDPOINTSLICES, PODS, SERVICES, path_of

log = logging.getLogger("kubesim")
TEMPLATE_HASH_LABEL = "pod-template-hash"


def pod_ready(pod: dict[str, Any]) -> bool:
    """The pod's Ready condition."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def template_hash(template: dict[str, Any]) -> str:
    """The value of the pods' pod-template-hash label."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _resolve(value: int | str, total: int, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    share = total * int(str(value).rstrip("%")) / 100
    return math.ceil(share) if round_up else math.floor(share)


async def _send(server: ApiServer, method: str, path: str, **kwargs: Any) -> Any:
    """One request; a 404 or 409 is a race with another writer, looked at again next sync."""
    async with server.request(method, path, **kwargs) as response:
        if response.status in (404, 409):
            return None
        if response.status >= 300:
            log.warning("%s %s: %s %s", method, path, response.status, await response.text())
            return None
        return await response.json()


class DeploymentController:
    """Pods for each Deployment, rolled and counted."""

    manager = "deployment-controller"

    def __init__(self, server: ApiServer) -> None:
        self.server = server

    async def sync(self) -> None:
        """One pass over every Deployment."""
        pods = self.server.list_objects(PODS)
        for deployment in self.server.list_objects(DEPLOYMENTS):
            uid = deployment["metadata"]["uid"]
            await self._sync_one(deployment, [p for p in pods if _owned_by(p, uid)])

    async def _sync_one(self, deployment: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        meta, spec = deployment["metadata"], deployment["spec"]
        wanted = int(spec.get("replicas", 1))
        current = template_hash(spec["template"])
        new = [
            p for p in pods if p["metadata"].get("labels", {}).get(TEMPLATE_HASH_LABEL) == current
        ]
        old = [p for p in pods if p not in new]
        rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        surge = _resolve(rolling.get("maxSurge", "25%"), wanted, round_up=True)
        unavailable = _resolve(rolling.get("maxUnavailable", "25%"), wanted, round_up=False)
        if surge == 0 and unavailable == 0:
            unavailable = 1

        # Start new pods, up to the surge.
        room = wanted + surge - len(pods)
        for _ in range(max(0, min(wanted - len(new), room))):
            await self._create_pod(deployment, current)

        # Retire old pods while enough others stay ready; not-ready ones cost nothing.
        ready = sum(1 for p in pods if pod_ready(p))
        spare = ready - (wanted - unavailable)
        for pod in sorted(old, key=pod_ready):
            if pod_ready(pod):
                if spare <= 0:
                    break
                spare -= 1
            await self._delete_pod(pod)

        # Scale in: the surplus of new pods, not-ready and youngest first.
        surplus = len(new) - wanted
        by_value = sorted(
            new, key=lambda p: (pod_ready(p), p["metadata"].get("creationTimestamp", ""))
        )
        for pod in by_value[: max(0, surplus)]:
            await self._delete_pod(pod)

        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(pods),
            "updatedReplicas": len(new),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(0, wanted - ready),
        }
        if {k: (deployment.get("status") or {}).get(k) for k in status} != status:
            path = path_of(DEPLOYMENTS, meta["namespace"], meta["name"]) + "/status"
            await _send(
                self.server,
                "PATCH",
                path,
                json={"status": status},
                headers={"Content-Type": MERGE},
                params={"fieldManager": self.manager},
            )

    async def _create_pod(self, deployment: dict[str, Any], current: str) -> None:
        meta, template = deployment["metadata"], deployment["spec"]["template"]
        labels = {
            **(template.get("metadata") or {}).get("labels", {}),
            TEMPLATE_HASH_LABEL: current,
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{current}-{uuid.uuid4().hex[:5]}",
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {**template["spec"], "nodeName": "kubesim-node"},
            "status": {"phase": "Pending"},
        }
        await _send(
            self.server,
            "POST",
            path_of(PODS, meta["namespace"]),
            json=pod,
            params={"fieldManager": self.manager},
        )

    async def _delete_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        await _send(self.server, "DELETE", path_of(PODS, meta["namespace"], meta["name"]))


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
            ]
            await self._write(service, sorted(chosen, key=lambda p: p["metadata"]["name"]))

    async def _write(self, service: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        meta = service["metadata"]
        endpoints = [
            {
                "addresses": [p["status"]["podIP"]],
                "conditions": {
                    "ready": pod_ready(p),
                    "serving": pod_ready(p),
                    "terminating": False,
                },
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
        await _send(
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
            if refs and not any(ref.get("uid") in alive for ref in refs):
                resource_path = f"{resource.group}/{resource.version}/{resource.plural}".lstrip("/")
                path = path_of(resource_path, meta.get("namespace"), meta["name"])
                await _send(self.server, "DELETE", path)
