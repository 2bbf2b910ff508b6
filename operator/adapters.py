"""Keeping every ready pod's LoRA adapters equal to `spec.adapters`.

Each pod converges by itself on the adapters file (a mounted ConfigMap), but
the kubelet refreshes such a volume only every minute or so. This loop makes
convergence fast and visible: it reads each ready pod's `/v1/models`, calls
`/v1/load_lora_adapter` or `/v1/unload_lora_adapter` where the pod differs
from the spec, and reports, per adapter, how many ready pods serve it
(`status.adapters`), the `AdaptersReady` condition, and Events on load,
unload and failure. A pod that refuses an adapter `FAILURE_THRESHOLD` times
in a row counts as failed for it, with the runtime's own error message.

Every load and unload carries the LLMService's `metadata.generation`, as the
adapters file does (render/configmap.py): the pod remembers the highest one
applied and skips a file older than that, so a file that has not caught up
with a removal yet cannot load the adapter again.

`plan` and `summarize` are pure; `AdapterSync.tick` does the I/O through a
`PodClient`, so tests can put a network of their own behind it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pagoda.operator.api import KubeApi
from pagoda.operator.llmservice import LLMService
from pagoda.operator.pod_http import PodHttp, PodHttpError
from pagoda.operator.render.paths import adapter_path
from pagoda.operator.scrape import Target, base_url, targets

# Attempts before a pod counts as failed for an adapter (a transient error,
# such as a pod still starting, clears by itself before that).
FAILURE_THRESHOLD = 3
DEFAULT_TIMEOUT = 30.0  # loading reads a folder: slower than a metrics scrape

EventTuple = tuple[str, str, str]


class PodCallError(Exception):
    """A call to a pod failed; `message` is the runtime's own words when it gave any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PodClient(Protocol):
    """The runtime's adapter API on one pod (base URL `http://IP:PORT`).

    `generation` is the LLMService generation the call acts for (None: not
    known, the call orders nothing on the pod).
    """

    async def models(self, url: str) -> dict[str, str]:
        """Loaded adapters: name -> the path it was loaded from."""
        ...

    async def load(self, url: str, name: str, path: str, *, generation: int | None) -> None:
        """Load (or replace) an adapter; raises PodCallError."""
        ...

    async def unload(self, url: str, name: str, *, generation: int | None) -> None:
        """Unload an adapter; raises PodCallError (not for one already gone)."""
        ...


@dataclass(frozen=True, slots=True)
class Plan:
    """What one pod needs: (name, path) to load, names to unload."""

    load: tuple[tuple[str, str], ...] = ()
    unload: tuple[str, ...] = ()


def plan(desired: Mapping[str, str], loaded: Mapping[str, str]) -> Plan:
    """The calls that make `loaded` equal `desired` (both name -> path).

    An adapter loaded from another path is loaded again with `replace`:
    requests in flight finish on the old weights.
    """
    return Plan(
        load=tuple((n, p) for n, p in desired.items() if loaded.get(n) != p),
        unload=tuple(n for n in loaded if n not in desired),
    )


def desired_adapters(llms: LLMService) -> dict[str, str]:
    """name -> path as the pods see it, in spec order."""
    return {a.name: adapter_path(llms, a.source) for a in llms.spec.adapters}


@dataclass(frozen=True, slots=True)
class Health:
    """The `AdaptersReady` condition: (status, reason, message)."""

    ready: bool | None  # None: unknown (no ready pod to ask)
    reason: str
    message: str


def summarize(
    desired: Mapping[str, str],
    pods: Mapping[str, Mapping[str, str] | None],
    failed: Mapping[tuple[str, str], str],
) -> tuple[list[dict[str, Any]], Health]:
    """`status.adapters` and the condition, from what each ready pod serves.

    `pods` maps each ready pod to its loaded adapters (None: it did not
    answer); `failed` maps (pod, adapter) past the threshold to the error.
    """
    entries = []
    for name in desired:
        serving = sum(1 for loaded in pods.values() if loaded and loaded.get(name) == desired[name])
        errors = [(pod, msg) for (pod, adapter), msg in sorted(failed.items()) if adapter == name]
        entry = {"name": name, "readyPods": serving, "failedPods": len(errors), "message": ""}
        if errors:
            entry["message"] = f"pod {errors[0][0]}: {errors[0][1]}"
        entries.append(entry)
    if failed:
        (pod, name), message = sorted(failed.items())[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return entries, Health(
            False, "AdapterFailed", f"adapter {name} on pod {pod}: {message}{more}"
        )
    if not pods:
        return entries, Health(None, "NoReadyPods", "no ready pod to load adapters into")
    missing = [e for e in entries if e["readyPods"] < len(pods)]
    if missing:
        first = missing[0]
        return entries, Health(
            False,
            "Loading",
            f"adapter {first['name']} on {first['readyPods']} of {len(pods)} ready pods",
        )
    return entries, Health(
        True, "AdaptersLoaded", f"{len(desired)} adapters on {len(pods)} ready pods"
    )


@dataclass(slots=True)
class TickResult:
    """What one pass did, for the caller to tell."""

    events: list[EventTuple] = field(default_factory=list)
    health: Health | None = None
    converged: bool = False


@dataclass(slots=True)
class AdapterSync:
    """The adapter loop's memory for one LLMService."""

    api: KubeApi
    client: PodClient
    concurrency: int = 8
    # (pod, adapter) -> (consecutive failed attempts, last error)
    attempts: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    written: list[dict[str, Any]] | None = None

    async def tick(self, llms: LLMService, selector: Mapping[str, str]) -> TickResult:
        """One pass over the ready pods. Raises ApiError only for transient errors."""
        desired = desired_adapters(llms)
        pods = await self.api.list("Pod", llms.namespace, selector)
        ready = targets(pods, base_url)
        gate = asyncio.Semaphore(self.concurrency)
        out = TickResult()

        async def one(target: Target) -> dict[str, str] | None:
            async with gate:
                return await self._converge(target, desired, llms.generation, out.events)

        served = await asyncio.gather(*(one(t) for t in ready))
        names = {t.pod for t in ready}
        # A pod gone, or an adapter no longer wanted, starts afresh.
        self.attempts = {
            key: value
            for key, value in self.attempts.items()
            if key[0] in names and key[1] in desired
        }
        failed = {key: msg for key, (n, msg) in self.attempts.items() if n >= FAILURE_THRESHOLD}
        entries, out.health = summarize(
            desired, {t.pod: loaded for t, loaded in zip(ready, served, strict=True)}, failed
        )
        out.converged = out.health.ready is True
        if entries != self.written:
            await self.api.patch_status(llms.namespace, llms.name, {"adapters": entries})
            self.written = entries
        return out

    async def _converge(
        self,
        target: Target,
        desired: Mapping[str, str],
        generation: int | None,
        events: list[EventTuple],
    ) -> dict[str, str] | None:
        """Make one pod serve `desired` (of spec `generation`); its adapters
        afterwards (None: unreachable)."""
        try:
            loaded = await self.client.models(target.url)
        except PodCallError:
            return None  # not answering: readiness will tell, nothing to count
        todo = plan(desired, loaded)
        for name in todo.unload:
            try:
                await self.client.unload(target.url, name, generation=generation)
            except PodCallError as e:
                events.append(
                    ("Warning", "AdapterUnloadFailed", f"adapter {name} on pod {target.pod}: {e}")
                )
                continue
            loaded.pop(name, None)
            events.append(
                ("Normal", "AdapterUnloaded", f"adapter {name} unloaded from pod {target.pod}")
            )
        for name, path in todo.load:
            key = (target.pod, name)
            try:
                await self.client.load(target.url, name, path, generation=generation)
            except PodCallError as e:
                count = self.attempts.get(key, (0, ""))[0] + 1
                self.attempts[key] = (count, str(e))
                if count == FAILURE_THRESHOLD:
                    events.append(
                        (
                            "Warning",
                            "AdapterFailed",
                            f"adapter {name} failed on pod {target.pod} "
                            f"after {count} attempts: {e}",
                        )
                    )
                continue
            self.attempts.pop(key, None)
            loaded[name] = path
            events.append(("Normal", "AdapterLoaded", f"adapter {name} loaded on pod {target.pod}"))
        for name in desired:
            if loaded.get(name) == desired[name]:
                self.attempts.pop((target.pod, name), None)
        return loaded


def _error_message(status: int, body: bytes) -> str:
    """The runtime's OpenAI-style error message, or the status and the body's start."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"


def _with_generation(body: dict[str, Any], generation: int | None) -> dict[str, Any]:
    """`body` with the runtime's `generation` field (Pagoda's extension of
    vLLM's routes; a runtime that predates it ignores it)."""
    return body if generation is None else {**body, "generation": generation}


class HttpPodClient:
    """`PodClient` over HTTP (`PodHttp`)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self._http = PodHttp()

    async def _call(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        try:
            status, data = await self._http.request(method, url, self.timeout, json=body)
        except PodHttpError as e:
            raise PodCallError(str(e)) from None
        if status != 200:
            raise PodCallError(_error_message(status, data), status)
        try:
            return json.loads(data)
        except ValueError:
            raise PodCallError(f"{url}: not JSON") from None

    async def models(self, url: str) -> dict[str, str]:
        listed = await self._call("GET", url + "/v1/models")
        try:
            return {
                str(m["id"]): str(m.get("root") or "")
                for m in listed["data"]
                if m.get("parent") is not None
            }
        except (KeyError, TypeError):
            raise PodCallError(f"{url}/v1/models: not a model list") from None

    async def load(self, url: str, name: str, path: str, *, generation: int | None) -> None:
        body = _with_generation({"lora_name": name, "lora_path": path, "replace": True}, generation)
        await self._call("POST", url + "/v1/load_lora_adapter", body)

    async def unload(self, url: str, name: str, *, generation: int | None) -> None:
        body = _with_generation({"lora_name": name}, generation)
        try:
            await self._call("POST", url + "/v1/unload_lora_adapter", body)
        except PodCallError as e:
            if e.status != 404:  # already gone (the file got there first)
                raise

    async def close(self) -> None:
        """Close the session (operator shutdown)."""
        await self._http.close()
