"""Fixtures for the operator tests: a Kubernetes emulator (kmock) and the operator.

The resync interval is set before `pagoda.operator.main` is imported anywhere,
because kopf reads a timer's interval when the decorator runs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml

os.environ["PAGODA_OPERATOR_RESYNC_SECONDS"] = "0.5"

from pagoda.operator.cli import Options, serve
from pagoda.operator.config import OperatorConfig
from pagoda.operator.model import ResourcesSpec

RESOURCES: dict[str, dict[str, Any]] = {
    "pagoda.dev/v1alpha1/llmservices": {
        "kind": "LLMService",
        "namespaced": True,
        "subresources": {"status", "scale"},
        "verbs": {"get", "list", "watch", "create", "update", "patch", "delete"},
    },
    "apps/v1/deployments": {"kind": "Deployment", "namespaced": True, "subresources": {"status"}},
    "policy/v1/poddisruptionbudgets": {"kind": "PodDisruptionBudget", "namespaced": True},
    "v1/configmaps": {"kind": "ConfigMap", "namespaced": True},
    "v1/services": {"kind": "Service", "namespaced": True},
    "v1/secrets": {"kind": "Secret", "namespaced": True},
    "v1/persistentvolumeclaims": {"kind": "PersistentVolumeClaim", "namespaced": True},
    "v1/pods": {"kind": "Pod", "namespaced": True},
    "v1/events": {"kind": "Event", "namespaced": True},
    # kopf's backbone: it must discover namespaces (never lists them when cluster-wide)
    # and watches CRDs to notice new resources.
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "kind": "CustomResourceDefinition",
        "namespaced": False,
        "verbs": {"list", "watch"},
    },
}

CONFIG = OperatorConfig(
    runtime_image="registry.test/pagoda-runtime:1",
    profiles={"h100": ResourcesSpec(gpus=1, gpu_type="NVIDIA-H100-80GB-HBM3", memory="64Gi")},
)


class VersionedEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what kopf relies on: resourceVersion and generation bumps.

    kmock 0.8 keeps whatever resourceVersion a client sent. kopf waits for the
    version its own patch produced before it trusts the next event, so with a
    constant version every change costs its 5 s consistency timeout. Here each
    write gets a fresh version, and a spec change a new generation, as on a real
    API server.
    """

    _versions = itertools.count(1000)

    async def _handle(self, request: Any) -> Any:
        if request.resource is not None and request.action in (
            kmock.action.CREATE,
            kmock.action.UPDATE,
        ):
            version = str(next(self._versions))
            data = request.data
            if isinstance(data, dict):
                meta = data.setdefault("metadata", {})
                meta["resourceVersion"] = version
                if request.action == kmock.action.CREATE:
                    meta.setdefault("generation", 1)
                elif "spec" in data and request.subresource is None:
                    key = (request.resource, request.namespace, request.name)
                    if key in self.objects and not self.objects[key].deleted:
                        old = self.objects[key].get("metadata", {}).get("generation") or 1
                        meta["generation"] = old + 1
            elif isinstance(data, list):  # a JSON patch: kopf's finalizer edits
                key = (request.resource, request.namespace, request.name)
                live = self.objects[key].get("metadata", {}).get("resourceVersion")
                tests = [op for op in data if op.get("op") == "test"]
                if any(op.get("path") == "/metadata/resourceVersion" for op in tests) and any(
                    op.get("value") != live for op in tests
                ):
                    # What a real API server answers, and what kopf retries on.
                    raise kmock.KubernetesError(422, "Invalid", "resourceVersion changed")
                data.append(
                    {"op": "replace", "path": "/metadata/resourceVersion", "value": version}
                )
        return await super()._handle(request)


@pytest.fixture()
def kmock_options() -> dict[str, Any]:
    """Use the versioning emulator for the `kmock` fixture."""
    return {"cls": VersionedEmulator}


@pytest.fixture()
def cluster(kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """kmock with our resources declared and a kubeconfig that points at it."""
    for key, info in RESOURCES.items():
        kmock.resources[key] = info
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
        "current-context": "kmock",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(path))
    return kmock


@pytest.fixture()
async def operator(cluster: Any) -> AsyncIterator[Any]:
    """The operator, cluster-wide, in its own thread and event loop.

    Its own loop because kopf, when it stops, cancels every task it did not
    start in its loop, pytest's fixture finalizers included. The emulator keeps
    serving from the test's loop; tests await while the operator works.
    """
    stop, ready = threading.Event(), threading.Event()
    options = Options(standalone=True, liveness=None, metrics_port=None)
    coroutine = serve(options, config=CONFIG, stop_flag=stop, ready_flag=ready)
    thread = threading.Thread(target=asyncio.run, args=(coroutine,), name="operator")
    thread.start()
    assert await asyncio.to_thread(ready.wait, 10), "the operator did not start"
    yield cluster
    stop.set()
    await asyncio.to_thread(thread.join, 20)
    assert not thread.is_alive(), "the operator did not stop"
