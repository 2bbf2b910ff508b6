"""Reading the runtime pods' own /metrics: the autoscaler's only input.

Each ready pod serves Prometheus text at `/metrics` on its HTTP port (the
same port as the OpenAI API, as vLLM does). The operator reads it directly,
pod by pod, so no Prometheus or metrics adapter is needed: a short timeout
per pod, a bound on how many are read at once, and a cap on the body size.

A pod that does not answer, answers with an error status, or answers with
text that is not a Pagoda/vLLM runtime's metrics is a `ScrapeError`: the
scaler skips it (never counts it as an idle pod). `parse_metrics` is pure;
`scrape` does the I/O through a `Fetch` function, so the tests and the e2e
harness can put a network of their own behind it.

Counters (requests received, the time requests spent in the batch) mean
something only between two readings of the same pod: `Rates` keeps each
pod's previous reading, keyed by its uid and restart count, and turns the
difference into a rate. A pod's first reading, and a counter that went back
(the runtime restarted), give no rate: missing data, never a zero.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pagoda.operator.pod_http import PodHttp, PodHttpError
from pagoda.operator.scaler import PodSample
from pagoda.operator.status import pod_ready
from prometheus_client.parser import text_string_to_metric_families

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
# Requests the API process holds before the engine sees them (tokenizing):
# they wait just the same, so they count towards the queue.
PENDING = "pagoda:num_requests_pending"
# Counters: requests the engine accepted, and how many finished and their
# time in the batch (a histogram's count and sum). Optional: a runtime
# without them is scaled on the gauges alone.
RECEIVED = "pagoda:requests_received_total"
FINISHED = "vllm:request_inference_time_seconds_count"
BUSY = "vllm:request_inference_time_seconds_sum"
# Requests turned away because the queue was full (--max-waiting-requests):
# they never reach the received count, so while a pod refuses some, its
# arrivals say less than the demand.
REJECTED = "pagoda:requests_rejected_total"
OVERLOADED = "overloaded"
# A runtime's exposition is ~20 KiB; anything much larger is not one.
MAX_BODY = 1 << 20
# A tick's scrapes must finish well within the shortest interval (1 s).
DEFAULT_TIMEOUT = 2.0
DEFAULT_CONCURRENCY = 16

# (url, timeout seconds) -> the body; raises ScrapeError.
Fetch = Callable[[str, float], Awaitable[str]]


class ScrapeError(Exception):
    """A pod's metrics could not be read; `reason` is one word for metrics and Events."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # Timeout, Unreachable, HTTPError, Malformed


@dataclass(frozen=True, slots=True)
class Target:
    """One ready pod and a URL of it (its metrics, its API)."""

    pod: str
    url: str
    # Which run of the pod: uid and restart count (a restart starts its counters afresh).
    key: str = ""


@dataclass(frozen=True, slots=True)
class Reading:
    """One pod's exposition: its gauges now, its counters since the runtime started."""

    queue: float  # vllm:num_requests_waiting + pagoda:num_requests_pending
    running: float = 0.0
    kv_cache_usage: float = 0.0
    received: float | None = None  # None: the runtime has no such series
    finished: float | None = None
    busy_seconds: float | None = None
    refused: float = 0.0  # turned away as overloaded

    def gauges(self) -> PodSample:
        """The sample without rates (a pod read for the first time)."""
        return PodSample(self.queue, self.running, self.kv_cache_usage)


def _value(value: float, name: str) -> float:
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise ScrapeError("Malformed", f"{name} is {value}")
    return value


def parse_metrics(text: str) -> Reading:
    """The queue, running, KV-cache numbers and counters of one pod's exposition text.

    Every series of a name is summed (one per model name; a pod serves one),
    except KV-cache usage, of which the highest is kept. Text that does not
    parse, or lacks `vllm:num_requests_waiting`, or carries a negative or
    non-finite value, raises ScrapeError("Malformed").
    """
    totals: dict[str, float] = {}
    kv = refused = 0.0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == KV_CACHE_USAGE:
                    kv = max(kv, _value(sample.value, sample.name))
                elif sample.name == REJECTED and sample.labels.get("reason") == OVERLOADED:
                    refused += _value(sample.value, sample.name)
                elif sample.name in (WAITING, RUNNING, PENDING, RECEIVED, FINISHED, BUSY):
                    totals[sample.name] = totals.get(sample.name, 0.0) + _value(
                        sample.value, sample.name
                    )
    except ScrapeError:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise ScrapeError("Malformed", f"not Prometheus text: {e}") from None
    if WAITING not in totals:
        raise ScrapeError("Malformed", f"no {WAITING} series: not a Pagoda runtime's metrics")
    return Reading(
        queue=totals[WAITING] + totals.get(PENDING, 0.0),
        running=totals.get(RUNNING, 0.0),
        kv_cache_usage=min(kv, 1.0),
        received=totals.get(RECEIVED),
        finished=totals.get(FINISHED),
        busy_seconds=totals.get(BUSY),
        refused=refused,
    )


class Rates:
    """Each pod's previous reading, to turn its counters into rates (one per LLMService)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, Reading]] = {}

    def sample(self, key: str, time: float, reading: Reading) -> PodSample:
        """The pod's gauges, and its counters' changes since its previous reading.

        No previous reading, a counter lower than before (a restart the key
        did not tell), or no time passed: no rates. A series the runtime
        does not have: no rate for it.
        """
        previous = self._last.get(key)
        self._last[key] = (time, reading)
        sample = reading.gauges()
        if previous is None or time <= previous[0]:
            return sample
        then, before = previous
        pairs = [
            (reading.received, before.received),
            (reading.finished, before.finished),
            (reading.busy_seconds, before.busy_seconds),
            (reading.refused, before.refused),
        ]
        if any(now is not None and old is not None and now < old for now, old in pairs):
            return sample  # went back: the runtime started afresh
        arrivals = finished = busy = None
        if reading.received is not None and before.received is not None:
            arrivals = (reading.received - before.received) / (time - then)
        if None not in (
            reading.finished,
            before.finished,
            reading.busy_seconds,
            before.busy_seconds,
        ):
            finished = reading.finished - before.finished  # type: ignore[operator]
            busy = reading.busy_seconds - before.busy_seconds  # type: ignore[operator]
        return replace(
            sample,
            arrivals=arrivals,
            finished=finished,
            busy_seconds=busy,
            refused=reading.refused - before.refused,
        )

    def keep(self, keys: Iterable[str]) -> None:
        """Forget the pods not among `keys` (gone, or no longer ready)."""
        wanted = set(keys)
        for key in [k for k in self._last if k not in wanted]:
            del self._last[key]


def base_url(pod: Mapping[str, Any]) -> str | None:
    """The runtime's HTTP root on a pod: its IP and the port of its scrape annotation.

    The runtime serves its API and its metrics on one port (as vLLM does),
    and the pods carry the `prometheus.io/port` annotation a Prometheus
    reads; the operator reads the same one, so the two always agree. None
    for a pod without an IP.
    """
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    port = annotations.get("prometheus.io/port") or "8000"
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


def metrics_url(pod: Mapping[str, Any]) -> str | None:
    """Where a pod's metrics are: `base_url` and its `prometheus.io/path` annotation."""
    root = base_url(pod)
    if root is None:
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return root + (annotations.get("prometheus.io/path") or "/metrics")


def targets(
    pods: Iterable[Mapping[str, Any]],
    url_of: Callable[[Mapping[str, Any]], str | None] = metrics_url,
) -> list[Target]:
    """The ready, not terminating pods with an address, and `url_of` each."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or not pod_ready(pod):
            continue
        url = url_of(pod)
        if url is not None:
            name = meta.get("name", "?")
            restarts = sum(
                int(cs.get("restartCount") or 0)
                for cs in (pod.get("status") or {}).get("containerStatuses") or []
            )
            out.append(Target(name, url, f"{meta.get('uid') or name}/{restarts}"))
    return out


async def scrape(
    pods: Iterable[Target],
    fetch: Fetch,
    timeout: float = DEFAULT_TIMEOUT,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> dict[str, Reading | ScrapeError]:
    """Read every target at most `concurrency` at a time: pod name -> reading or error."""
    gate = asyncio.Semaphore(concurrency)

    async def one(target: Target) -> Reading | ScrapeError:
        async with gate:
            try:
                text = await asyncio.wait_for(fetch(target.url, timeout), timeout)
                return parse_metrics(text)
            except ScrapeError as e:
                return e
            except TimeoutError:
                return ScrapeError("Timeout", f"no answer within {timeout:g} s")

    listed = list(pods)
    results = await asyncio.gather(*(one(t) for t in listed))
    return {t.pod: r for t, r in zip(listed, results, strict=True)}


class HttpFetch:
    """`Fetch` over HTTP (`PodHttp`): a 200 with a bounded UTF-8 body, else ScrapeError."""

    def __init__(self) -> None:
        self._http = PodHttp()

    async def __call__(self, url: str, timeout: float) -> str:
        try:
            status, body = await self._http.request("GET", url, timeout, max_body=MAX_BODY)
        except PodHttpError as e:
            raise ScrapeError(e.reason, str(e)) from None
        if status != 200:
            raise ScrapeError("HTTPError", f"{url} answered {status}")
        if len(body) > MAX_BODY:
            raise ScrapeError("Malformed", f"{url}: body over {MAX_BODY} bytes")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ScrapeError("Malformed", f"{url}: not UTF-8 ({e})") from None

    async def close(self) -> None:
        """Close the session (operator shutdown)."""
        await self._http.close()
