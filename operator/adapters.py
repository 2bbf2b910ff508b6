"""Keeping every ready pod's LoRA adapters equal to `spec.adapters`.

Each pod converges by itself on the adapters file (a mounted ConfigMap), but
the kubelet refreshes such a volume only every minute or so. This loop makes
convergence fast and visible: it reads each ready pod's `/v1/models`, calls
`/v1/load_lora_adapter` or `/v1/unload_lora_adapter` where the pod differs
from the spec (all on the pod's admin port, with the admin Secret's key as
a bearer token: the public port does not serve these routes), and reports,
per adapter, how many ready pods serve it (`status.adapters`), the
`AdaptersReady` condition, and Events on load, unload and failure. A pod
that refuses an adapter `FAILURE_THRESHOLD` times in a row counts as failed
for it, with the runtime's own error message.

Every load and unload carries the LLMService's `metadata.generation`, as the
adapters file does (render/configmap.py): the pod remembers the highest one
applied and skips a file older than that, so a file that has not caught up
with a removal yet cannot load the adapter again.

A pod that refuses the key (401/403: the Secret was replaced after the pod
started, say) is reported on the condition (`AdminKeyRejected`) and with one
Warning per pod, and the loop backs off exponentially instead of retrying
every second; the key is read again from the Secret before the next try. A
Secret the operator may not read is `AdminKeyUnreadable`, backed off alike.

`plan` and `summarize` are pure; `AdapterSync.tick` does the I/O through a
`PodClient`, so tests can put a network of their own behind it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pagoda.operator.api import KubeApi
from pagoda.operator.errors import ApiError
from pagoda.operator.llmservice import LLMService
from pagoda.operator.pod_http import PodHttp, PodHttpError
from pagoda.operator.render.labels import ADMIN_PORT_NAME, admin_secret_name
from pagoda.operator.render.paths import adapter_path
from pagoda.operator.render.secret import admin_key_of
from pagoda.operator.scrape import Target, base_url, targets

# Attempts before a pod counts as failed for an adapter (a transient error,
# such as a pod still starting, clears by itself before that).
FAILURE_THRESHOLD = 3
DEFAULT_TIMEOUT = 30.0  # loading reads a folder: slower than a metrics scrape
# Back-off while pods refuse the admin key: 1 s, doubling, up to this. A pod
# that changes (restarted with the current key) wakes the loop at once anyway.
MAX_AUTH_BACKOFF = 300.0
# HTTP statuses that mean "not this key": no retry can succeed with it.
AUTH_STATUSES = (401, 403)

EventTuple = tuple[str, str, str]


class PodCallError(Exception):
    """A call to a pod failed; `message` is the runtime's own words when it gave any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PodClient(Protocol):
    """The runtime's adapter API on one pod's admin port (base URL `http://IP:PORT`).

    `key` is the admin port's bearer token (None: send none). `generation` is
    the LLMService generation the call acts for (None: not known, the call
    orders nothing on the pod).
    """

    async def models(self, url: str, *, key: str | None) -> dict[str, str]:
        """Loaded adapters: name -> the path it was loaded from."""
        ...

    async def load(
        self, url: str, name: str, path: str, *, generation: int | None, key: str | None
    ) -> None:
        """Load (or replace) an adapter; raises PodCallError."""
        ...

    async def unload(self, url: str, name: str, *, generation: int | None, key: str | None) -> None:
        """Unload an adapter; raises PodCallError (not for one already gone)."""
        ...


def admin_url(pod: Mapping[str, Any]) -> str | None:
    """The runtime's admin listener on a pod: its IP and its container port
    named `admin`. A pod without one (made from an older template) serves the
    adapter routes on its HTTP port, so that is where it is called. None for
    a pod without an IP."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == ADMIN_PORT_NAME and port.get("containerPort"):
                host = f"[{ip}]" if ":" in ip else ip
                return f"http://{host}:{port['containerPort']}"
    return base_url(pod)


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
    """The `AdaptersReady` condition: (status, reason, message).

    `adapters` is the list (name, path) the pass that found it converged
    on: a condition about an older list says nothing about the current one.
    """

    ready: bool | None  # None: unknown (no ready pod to ask)
    reason: str
    message: str
    adapters: tuple[tuple[str, str], ...] | None = None

    def for_spec(self, llms: LLMService) -> Health:
        """This health, or Loading if it was found for another adapter list."""
        wanted = tuple(desired_adapters(llms).items())
        if self.adapters is None or self.adapters == wanted:
            return self
        return Health(False, "Loading", "loading the adapters of the new spec", wanted)


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
    # Seconds to wait before the next pass (None: the caller's own pace).
    retry_after: float | None = None


def auth_backoff(failures: int, rng: random.Random | None = None) -> float:
    """Seconds before pass `failures + 1` after that many passes in a row met
    a refused key: 1, 2, 4 ... up to MAX_AUTH_BACKOFF, each with up to 10%
    jitter so that many LLMServices locked out together do not retry in step."""
    base = min(MAX_AUTH_BACKOFF, 2.0 ** max(failures - 1, 0))
    return base * (1 + 0.1 * (rng or random).random())


@dataclass(slots=True)
class AdapterSync:
    """The adapter loop's memory for one LLMService."""

    api: KubeApi
    client: PodClient
    concurrency: int = 8
    # (pod, adapter) -> (consecutive failed attempts, last error)
    attempts: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    written: list[dict[str, Any]] | None = None
    # The admin Secret's key, read once and again after a pod refused it.
    key: str | None = None
    # Pods that refused the key on the last pass (pod -> error), and how many
    # passes in a row some pod did.
    rejected: dict[str, str] = field(default_factory=dict)
    auth_failures: int = 0

    async def tick(self, llms: LLMService, selector: Mapping[str, str]) -> TickResult:
        """One pass over the ready pods. Raises ApiError only for transient errors."""
        desired = desired_adapters(llms)
        pods = await self.api.list("Pod", llms.namespace, selector)
        ready = targets(pods, admin_url)
        out = TickResult()
        if self.key is None:
            try:
                self.key = await self._read_key(llms)
            except ApiError as e:
                if not e.permanent:
                    raise
                message = f"cannot read Secret {admin_secret_name(llms)}: {e}"
                return self._locked_out(out, "AdminKeyUnreadable", message)
        gate = asyncio.Semaphore(self.concurrency)
        rejected: dict[str, str] = {}

        async def one(target: Target) -> dict[str, str] | None:
            async with gate:
                try:
                    return await self._converge(target, desired, llms.generation, out.events)
                except PodCallError as e:  # only a refused key gets here
                    rejected[target.pod] = str(e)
                    return None

        served = await asyncio.gather(*(one(t) for t in ready))
        names = {t.pod for t in ready}
        # A pod gone, or an adapter no longer wanted, starts afresh.
        self.attempts = {
            key: value
            for key, value in self.attempts.items()
            if key[0] in names and key[1] in desired
        }
        failed = {key: msg for key, (n, msg) in self.attempts.items() if n >= FAILURE_THRESHOLD}
        entries, health = summarize(
            desired, {t.pod: loaded for t, loaded in zip(ready, served, strict=True)}, failed
        )
        out.health = dataclasses.replace(health, adapters=tuple(desired.items()))
        out.converged = out.health.ready is True
        if entries != self.written:
            await self.api.patch_status(llms.namespace, llms.name, {"adapters": entries})
            self.written = entries
        if rejected:
            self._rejected(llms, rejected, out)
        else:
            self.rejected, self.auth_failures = {}, 0
        return out

    async def _read_key(self, llms: LLMService) -> str | None:
        """The admin Secret's key (None while the reconcile has not made it yet)."""
        return admin_key_of(await self.api.get("Secret", llms.namespace, admin_secret_name(llms)))

    def _rejected(self, llms: LLMService, rejected: dict[str, str], out: TickResult) -> None:
        """Pods refused the key: one Warning per newly refusing pod, the condition, back-off."""
        secret = admin_secret_name(llms)
        for pod, error in sorted(rejected.items()):
            if pod not in self.rejected:
                out.events.append(
                    (
                        "Warning",
                        "AdminKeyRejected",
                        f"pod {pod} refused the admin key of Secret {secret}: {error}",
                    )
                )
        self.rejected = rejected
        pod, error = sorted(rejected.items())[0]
        more = f" (and {len(rejected) - 1} more)" if len(rejected) > 1 else ""
        self._locked_out(
            out,
            "AdminKeyRejected",
            f"pod {pod}{more} refused the admin key of Secret {secret} ({error}); "
            "a pod started before the Secret changed holds the old key until restarted",
        )

    def _locked_out(self, out: TickResult, reason: str, message: str) -> TickResult:
        """`out` for a pass that could not talk to the pods: the condition, and
        the next pass backed off. The key is read again before it."""
        self.key = None
        self.auth_failures += 1
        out.health = Health(False, reason, message)
        out.converged = False
        out.retry_after = auth_backoff(self.auth_failures)
        return out

    async def _converge(
        self,
        target: Target,
        desired: Mapping[str, str],
        generation: int | None,
        events: list[EventTuple],
    ) -> dict[str, str] | None:
        """Make one pod serve `desired` (of spec `generation`); its adapters
        afterwards (None: unreachable). Raises PodCallError when the pod
        refuses the key: no other call can succeed then."""
        admin_key = self.key
        try:
            loaded = await self.client.models(target.url, key=admin_key)
        except PodCallError as e:
            if e.status in AUTH_STATUSES:
                raise
            return None  # not answering: readiness will tell, nothing to count
        todo = plan(desired, loaded)
        for name in todo.unload:
            try:
                await self.client.unload(target.url, name, generation=generation, key=admin_key)
            except PodCallError as e:
                if e.status in AUTH_STATUSES:
                    raise
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
                await self.client.load(target.url, name, path, generation=generation, key=admin_key)
            except PodCallError as e:
                if e.status in AUTH_STATUSES:
                    raise
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

    async def _call(
        self, method: str, url: str, key: str | None, body: dict[str, Any] | None = None
    ) -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key else None
        try:
            status, data = await self._http.request(
                method, url, self.timeout, json=body, headers=headers
            )
        except PodHttpError as e:
            raise PodCallError(str(e)) from None
        if status != 200:
            raise PodCallError(_error_message(status, data), status)
        try:
            return json.loads(data)
        except ValueError:
            raise PodCallError(f"{url}: not JSON") from None

    async def models(self, url: str, *, key: str | None) -> dict[str, str]:
        listed = await self._call("GET", url + "/v1/models", key)
        try:
            return {
                str(m["id"]): str(m.get("root") or "")
                for m in listed["data"]
                if m.get("parent") is not None
            }
        except (KeyError, TypeError):
            raise PodCallError(f"{url}/v1/models: not a model list") from None

    async def load(
        self, url: str, name: str, path: str, *, generation: int | None, key: str | None
    ) -> None:
        body = _with_generation({"lora_name": name, "lora_path": path, "replace": True}, generation)
        await self._call("POST", url + "/v1/load_lora_adapter", key, body)

    async def unload(self, url: str, name: str, *, generation: int | None, key: str | None) -> None:
        body = _with_generation({"lora_name": name}, generation)
        try:
            await self._call("POST", url + "/v1/unload_lora_adapter", key, body)
        except PodCallError as e:
            if e.status != 404:  # already gone (the file got there first)
                raise

    async def close(self) -> None:
        """Close the session (operator shutdown)."""
        await self._http.close()
