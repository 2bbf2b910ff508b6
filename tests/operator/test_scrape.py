"""Reading the pods' /metrics: what counts, what is malformed, what a dead pod gives."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp.web
import pytest
from kubesim.http import serve_app
from pagoda.operator.scaler import PodSample
from pagoda.operator.scrape import (
    HttpFetch,
    Rates,
    Reading,
    ScrapeError,
    Target,
    metrics_url,
    parse_metrics,
    scrape,
    targets,
)
from pagoda.runtime.entrypoints.openai.metrics import ServingMetrics
from prometheus_client import CollectorRegistry, generate_latest


def runtime_exposition(waiting: int, running: int, pending: int, kv: float) -> str:
    """The text a real runtime serves, from the runtime's own metrics class."""
    registry = CollectorRegistry()
    metrics = ServingMetrics("smollm2", 512, registry)
    metrics.waiting.set(waiting)
    metrics.running.set(running)
    metrics.kv_usage.set(kv)
    metrics.track_pending(lambda: pending)
    return generate_latest(registry).decode()


def test_the_runtimes_own_exposition_parses_into_a_sample() -> None:
    sample = parse_metrics(runtime_exposition(waiting=3, running=4, pending=2, kv=0.25))
    # Pending requests (still in the API process) wait just the same; the
    # counters are there from the start, at zero.
    assert sample == Reading(
        queue=5, running=4, kv_cache_usage=0.25, received=0, finished=0, busy_seconds=0
    )


def test_series_of_several_models_are_summed_and_kv_usage_is_the_highest() -> None:
    text = (
        'vllm:num_requests_waiting{model_name="a"} 2\n'
        'vllm:num_requests_waiting{model_name="b"} 3\n'
        'vllm:num_requests_running{model_name="a"} 1\n'
        'vllm:kv_cache_usage_perc{model_name="a"} 0.5\n'
        'vllm:kv_cache_usage_perc{model_name="b"} 0.7\n'
    )
    assert parse_metrics(text) == Reading(queue=5, running=1, kv_cache_usage=0.7)


def test_the_counters_of_a_busy_runtime_are_read() -> None:
    registry = CollectorRegistry()
    metrics = ServingMetrics("smollm2", 512, registry)
    metrics.waiting.set(1)
    metrics.received.inc(7)
    metrics.inference_time.observe(2.0)
    metrics.inference_time.observe(3.0)
    metrics.on_rejected("overloaded")
    metrics.on_rejected("invalid_request")  # the client's fault: not demand turned away
    reading = parse_metrics(generate_latest(registry).decode())
    assert (reading.received, reading.finished, reading.busy_seconds) == (7, 2, 5.0)
    assert reading.refused == 1


def test_an_older_runtime_without_counters_is_read_on_its_gauges() -> None:
    reading = parse_metrics("vllm:num_requests_waiting 2\nvllm:num_requests_running 3\n")
    assert reading.received is None and reading.finished is None and reading.busy_seconds is None


def counters(received: float, finished: float = 0, busy: float = 0, queue: float = 0) -> Reading:
    return Reading(queue=queue, received=received, finished=finished, busy_seconds=busy)


def test_rates_come_from_two_readings_of_the_same_pod() -> None:
    rates = Rates()
    first = rates.sample("uid-a/0", 100.0, counters(50, 40, 400, queue=2))
    # The first reading of a pod: its gauges, no rate (missing, not zero).
    assert first == PodSample(queue=2)
    later = rates.sample("uid-a/0", 105.0, counters(60, 43, 433))
    assert later.arrivals == 2.0  # 10 requests in 5 s
    assert (later.finished, later.busy_seconds) == (3, 33)
    assert later.refused == 0
    # Another pod is its own history.
    assert rates.sample("uid-b/0", 105.0, counters(500)).arrivals is None


def test_a_counter_that_goes_back_gives_no_rate_then_counts_from_there() -> None:
    rates = Rates()
    rates.sample("p", 0.0, counters(900, 800, 8000))
    # The runtime restarted without the key changing: every counter is lower.
    assert rates.sample("p", 5.0, counters(3, 1, 10)).arrivals is None
    # Any one counter going back is enough.
    assert rates.sample("p", 10.0, counters(8, 0, 0)).arrivals is None
    assert rates.sample("p", 15.0, counters(13, 1, 11)).arrivals == 1.0


def test_rates_span_a_missed_scrape_and_forget_pods_that_left() -> None:
    rates = Rates()
    rates.sample("p", 0.0, counters(0))
    # No answer at 5 s (not sampled): the rate at 10 s is over the 10 s.
    assert rates.sample("p", 10.0, counters(30)).arrivals == 3.0
    rates.keep([])  # the pod is gone (or no longer ready)
    assert rates.sample("p", 15.0, counters(45)).arrivals is None
    # The same time twice (a clock that did not move): no rate.
    assert rates.sample("p", 15.0, counters(50)).arrivals is None


def test_a_runtime_without_the_histogram_gives_arrivals_only() -> None:
    rates = Rates()
    rates.sample("p", 0.0, Reading(queue=0, received=0))
    sample = rates.sample("p", 5.0, Reading(queue=0, received=5))
    assert sample.arrivals == 1.0 and sample.finished is None and sample.busy_seconds is None


@pytest.mark.parametrize(
    "text",
    [
        "",  # an empty page
        "<html>502 Bad Gateway</html>",  # a proxy's error page
        "process_cpu_seconds_total 1.0\n",  # some other exporter
        'vllm:num_requests_waiting{model_name="a"} NaN\n',
        'vllm:num_requests_waiting{model_name="a"} -1\n',
        'vllm:num_requests_waiting{model_name="a"} +Inf\n',
        'vllm:num_requests_waiting{model_name="a" 3\n',  # a broken label set
    ],
)
def test_malformed_metrics_are_a_scrape_error_not_a_zero(text: str) -> None:
    with pytest.raises(ScrapeError) as caught:
        parse_metrics(text)
    assert caught.value.reason == "Malformed"


def pod(name: str, ip: str | None, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "annotations": {"prometheus.io/port": "8000", "prometheus.io/path": "/metrics"},
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]
    }
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


def test_only_ready_pods_with_an_address_are_read() -> None:
    pods = [
        pod("a", "10.0.0.1"),
        pod("b", "10.0.0.2", ready=False),
        pod("c", None),
        pod("d", "10.0.0.4", deleting=True),
        pod("e", "fd00::5"),
    ]
    pods[0]["metadata"]["uid"] = "uid-a"
    pods[4]["status"]["containerStatuses"] = [{"restartCount": 2}]
    assert targets(pods) == [
        Target("a", "http://10.0.0.1:8000/metrics", "uid-a/0"),
        # A restart starts the runtime's counters afresh: a new key.
        Target("e", "http://[fd00::5]:8000/metrics", "e/2"),
    ]
    assert metrics_url({"status": {"podIP": "10.0.0.9"}}) == "http://10.0.0.9:8000/metrics"


async def test_each_pod_answers_for_itself_and_a_hung_one_times_out() -> None:
    pages = {"http://a/metrics": "vllm:num_requests_waiting 2\n"}

    async def fetch(url: str, timeout: float) -> str:
        if url == "http://hung/metrics":
            await asyncio.sleep(60)
        if url == "http://refused/metrics":
            raise ScrapeError("Unreachable", "connection refused")
        return pages[url]

    result = await scrape(
        [Target(n, f"http://{n}/metrics") for n in ("a", "hung", "refused")], fetch, timeout=0.2
    )
    assert result["a"] == Reading(queue=2)
    assert isinstance(result["hung"], ScrapeError) and result["hung"].reason == "Timeout"
    assert isinstance(result["refused"], ScrapeError) and result["refused"].reason == "Unreachable"


async def test_concurrency_is_bounded() -> None:
    inflight = peak = 0

    async def fetch(url: str, timeout: float) -> str:
        nonlocal inflight, peak
        inflight += 1
        peak = max(peak, inflight)
        await asyncio.sleep(0.01)
        inflight -= 1
        return "vllm:num_requests_waiting 0\n"

    await scrape([Target(str(i), f"http://{i}/") for i in range(20)], fetch, concurrency=3)
    assert peak == 3


async def test_http_fetch_against_a_real_server() -> None:
    async def metrics(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text=runtime_exposition(1, 2, 0, 0.5))

    async def broken(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(status=500, text="boom")

    async def huge(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=b"#" * (2 << 20))

    app = aiohttp.web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/broken", broken)
    app.router.add_get("/huge", huge)
    fetch = HttpFetch()
    async with serve_app(app) as base:
        try:
            result = await scrape(
                [
                    Target("ok", base + "/metrics"),
                    Target("500", base + "/broken"),
                    Target("huge", base + "/huge"),
                    Target("gone", "http://127.0.0.1:1/metrics"),
                ],
                fetch,
                timeout=2,
            )
        finally:
            await fetch.close()
    assert result["ok"] == Reading(
        queue=1, running=2, kv_cache_usage=0.5, received=0, finished=0, busy_seconds=0
    )
    reasons = {k: v.reason for k, v in result.items() if isinstance(v, ScrapeError)}
    assert reasons == {"500": "HTTPError", "huge": "Malformed", "gone": "Unreachable"}
