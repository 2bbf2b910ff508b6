"""A one-node Kubernetes for tests: API server, controllers, kubelet, kube-proxy, operator.

    async with Cluster(api_server, tmp_path, operator_config=config) as cluster:
        await cluster.create(llmservice_body)
        await cluster.wait_for(lambda: cluster.is_ready("smollm2"), 240, "Ready")
        client = openai.AsyncOpenAI(base_url=cluster.service_url("smollm2") + "/v1", ...)
        await cluster.scale("smollm2", 2)
        pod = cluster.pods("smollm2")[0]   # pod.url, pod.ip, pod.pid, pod.restarts
        cluster.kill(pod)
        cluster.kill_metrics(pod)          # the operator cannot read its /metrics

Everything runs in the test's event loop except the operator, which has its
own thread (see `operator.OperatorThread`). The control loops tick every
`tick` seconds; every wait is bounded (`wait_for`), and a wait that times out
says what the cluster looked like, pods' logs included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from kubesim.apiserver import MERGE, ApiServer
from kubesim.controllers import EndpointSliceController, GarbageCollector
from kubesim.deployments import DeploymentController
from kubesim.faults import MetricsNetwork
from kubesim.kubelet import Kubelet, PodProcess
from kubesim.network import AddressPool
from kubesim.operator import OperatorThread, write_kubeconfig
from kubesim.proxy import ServiceProxy
from kubesim.replicasets import ReplicaSetController
from kubesim.resources import declare
from kubesim.testing import LLMS, NS, RESOURCE_OF, create, events, path_of
from pagoda.operator.config import OperatorConfig

log = logging.getLogger("kubesim")


class Cluster:
    """The simulated cluster, and what a test does with it."""

    def __init__(
        self,
        api: ApiServer,
        workdir: Path,
        operator_config: OperatorConfig | None = None,
        tick: float = 0.2,
        probe_interval: float = 0.5,
    ) -> None:
        self.api = api
        self.workdir = workdir
        self.operator_config = operator_config
        self.tick = tick
        self.addresses = AddressPool()
        self.kubelet = Kubelet(api, workdir / "node", self.addresses, probe_interval)
        self.proxy = ServiceProxy(api, self.addresses)
        self.controllers = [
            DeploymentController(api),
            ReplicaSetController(api),
            EndpointSliceController(api),
            GarbageCollector(api),
        ]
        # How the operator reads pods' /metrics, with faults on demand.
        self.metrics_network = MetricsNetwork()
        self._loop: asyncio.Task[None] | None = None
        self._operator: OperatorThread | None = None
        self._kubeconfig_before: str | None = None

    async def __aenter__(self) -> Cluster:
        declare(self.api)
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = write_kubeconfig(self.workdir / "kubeconfig", str(self.api.url))
        self._kubeconfig_before = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = str(kubeconfig)
        self._loop = asyncio.create_task(self._control_loop(), name="kubesim control loop")
        if self.operator_config is not None:
            self._operator = OperatorThread(
                self.operator_config, memo={"scrape": self.metrics_network}
            )
            await self._operator.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._operator is not None:
                await self._operator.__aexit__(exc_type, exc, tb)
        finally:
            if self._loop is not None:
                self._loop.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._loop
            await self.kubelet.stop()
            await self.proxy.close()
            if self._kubeconfig_before is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = self._kubeconfig_before

    async def _control_loop(self) -> None:
        parts = [*self.controllers, self.kubelet, self.proxy]
        while True:
            for part in parts:
                try:
                    await part.sync()
                except Exception:
                    log.exception("%s failed; trying again next tick", type(part).__name__)
            await asyncio.sleep(self.tick)

    # ------------------------------------------------------------ writing
    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """`kubectl create`: POST the object."""
        return await create(self.api, body)

    async def scale(self, name: str, replicas: int, namespace: str = NS) -> None:
        """`kubectl scale llms/NAME --replicas=N`: through the scale subresource."""
        path = path_of(LLMS, namespace, name) + "/scale"
        body = {"spec": {"replicas": replicas}}
        params = {"fieldManager": "kubectl-scale"}
        async with self.api.patch(
            path, json=body, headers={"Content-Type": MERGE}, params=params
        ) as response:
            assert response.status < 300, await response.text()

    async def patch(
        self, kind: str, name: str, body: dict[str, Any], namespace: str = NS
    ) -> dict[str, Any]:
        """`kubectl patch KIND NAME --type merge -p BODY`."""
        path = path_of(RESOURCE_OF[kind], namespace, name)
        params = {"fieldManager": "kubectl-patch"}
        async with self.api.patch(
            path, json=body, headers={"Content-Type": MERGE}, params=params
        ) as response:
            assert response.status < 300, await response.text()
            return await response.json()

    async def delete(self, kind: str, name: str, namespace: str = NS) -> None:
        """`kubectl delete KIND NAME` (returns when the API server accepted it)."""
        async with self.api.delete(path_of(RESOURCE_OF[kind], namespace, name)) as response:
            assert response.status < 300, await response.text()

    def kill(self, pod: PodProcess | str, sig: int = signal.SIGKILL) -> int:
        """Kill a pod's container process (it is restarted); returns the pid killed."""
        return self.kubelet.kill(pod, sig)

    def kill_metrics(self, pod: PodProcess) -> None:
        """The operator can no longer read this pod's /metrics; the pod stays Ready."""
        self.metrics_network.kill_metrics(pod.ip)

    # ------------------------------------------------------------ reading
    def get(self, kind: str, name: str, namespace: str = NS) -> dict[str, Any] | None:
        """An object as stored, or None."""
        return self.api.get_object(RESOURCE_OF[kind], namespace, name)

    def objects(self, kind: str, namespace: str | None = NS) -> list[dict[str, Any]]:
        """Objects of a kind as stored."""
        return self.api.list_objects(RESOURCE_OF[kind], namespace)

    def condition(self, name: str, kind: str, namespace: str = NS) -> dict[str, Any] | None:
        """One condition of an LLMService."""
        llms = self.get("LLMService", name, namespace) or {}
        conditions = (llms.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == kind), None)

    def is_ready(self, name: str, namespace: str = NS) -> bool:
        """Whether the LLMService's Ready condition is True."""
        ready = self.condition(name, "Ready", namespace)
        return bool(ready and ready["status"] == "True")

    def pods(self, llmservice: str | None = None) -> list[PodProcess]:
        """The pods the kubelet runs (each with .name, .ip, .url, .pid, .restarts, .ready)."""
        return self.kubelet.pods(llmservice)

    def ready_pods(self, llmservice: str | None = None) -> list[PodProcess]:
        """The running pods whose readiness probe passes (not terminating)."""
        return [
            p for p in self.pods(llmservice) if p.ready and p.pid is not None and not p.stopping
        ]

    def service_url(self, name: str, namespace: str = NS) -> str:
        """http://CLUSTER-IP:PORT of a Service."""
        return self.proxy.url(name, namespace)

    async def wait_for(
        self, check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2
    ) -> Any:
        """Poll `check()` until it returns something truthy; fail after `timeout` s."""
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                result = check()
                if result:
                    return result
            except (KeyError, LookupError, AssertionError, TypeError) as e:
                last_error = e
            await asyncio.sleep(interval)
        raise AssertionError(
            f"not {what} within {timeout:.0f}s (last error: {last_error!r})\n{self.describe()}"
        )

    async def wait_for_events(
        self, reason: str, timeout: float = 10, count: int = 1
    ) -> list[dict[str, Any]]:
        """The Events of one reason, once at least `count` were posted.

        kopf posts Events from a queue of its own, after the handler that
        raised them returns: an Event may reach the API server after a status
        write the same handler made, so a test must wait for it, not read it.
        """
        return await self.wait_for(
            lambda: (found := events(self.api, reason)) and len(found) >= count and found,
            timeout,
            f"{count} {reason} Event(s)",
        )

    def describe(self) -> str:
        """What the cluster looks like: LLMServices, Deployments, ReplicaSets, pods and
        their logs (for failures)."""
        lines = []
        for llms in self.objects("LLMService", None):
            conditions = (llms.get("status") or {}).get("conditions") or []
            brief = [(c["type"], c["status"], c["reason"], c.get("message")) for c in conditions]
            lines.append(f"LLMService {llms['metadata']['name']}: {json.dumps(brief)}")
        for deployment in self.objects("Deployment", None):
            status = dict(deployment.get("status") or {})
            conditions = [
                (c["type"], c["status"], c["reason"]) for c in status.pop("conditions", [])
            ]
            lines.append(f"Deployment {deployment['metadata']['name']}: {status} {conditions}")
        for rs in self.objects("ReplicaSet", None):
            spec_replicas = rs["spec"].get("replicas")
            lines.append(f"ReplicaSet {rs['metadata']['name']}: {spec_replicas} {rs.get('status')}")
        for pod in self.kubelet.pods():
            lines.append(
                f"pod {pod.name} ip={pod.ip} pid={pod.pid} ready={pod.ready} "
                f"restarts={pod.restarts} waiting={pod.waiting}\n{pod.log(1500)}"
            )
        return "\n".join(lines) or "(nothing)"
