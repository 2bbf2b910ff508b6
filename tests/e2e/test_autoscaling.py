"""Autoscaling on queue depth, end to end: real `pagoda serve` pods, real /metrics, real load.

The LLMService runs one request at a time per pod (`maxNumSeqs: 1`), so four
concurrent clients build a real queue in `vllm:num_requests_waiting` (three
waiting against a target of one: a panic on the first tick that sees it).
The windows are set short so that a test lasts seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from kubesim.cluster import Cluster

from .conftest import STARTUP_TIMEOUT, light_cpu_demo

pytestmark = pytest.mark.usefixtures("smollm2_available")

NAME = "smollm2"
SCALE_DOWN_WINDOW = 8


def autoscaled(**autoscaling: Any) -> dict[str, Any]:
    """The light CPU demo, one sequence at a time per pod, with fast autoscaling."""
    body = light_cpu_demo()
    body["spec"]["engine"]["maxNumSeqs"] = 1
    body["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "targetQueueDepth": 1,
        "metricsIntervalSeconds": 1,
        "stableWindowSeconds": 6,
        "panicWindowSeconds": 2,
        "scaleDown": {"stabilizationSeconds": SCALE_DOWN_WINDOW},
        **autoscaling,
    }
    return body


def replicas(cluster: Cluster) -> int:
    return int(cluster.get("LLMService", NAME)["spec"]["replicas"])


@contextlib.asynccontextmanager
async def load(urls: list[str], clients: int, seconds: float = 120) -> AsyncIterator[list[int]]:
    """`clients` loops sending completions (each on a new connection) until the block ends.

    Bounded: it stops after `seconds` whatever happens. Yields the list of
    status codes answered so far.
    """
    answered: list[int] = []
    deadline = time.monotonic() + seconds
    body = {"model": NAME, "prompt": "Write a story about a pagoda.", "max_tokens": 48}

    async def client(url: str) -> None:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            while time.monotonic() < deadline:
                try:
                    response = await http.post(url + "/v1/completions", json=body)
                    answered.append(response.status_code)
                except httpx.HTTPError:
                    answered.append(0)
                    await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(client(urls[i % len(urls)])) for i in range(clients)]
    try:
        yield answered
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_queue_scales_out_within_30s_and_back_in_after_the_window(
    cluster: Cluster,
) -> None:
    await cluster.create(autoscaled())
    await cluster.wait_for(lambda: cluster.is_ready(NAME), STARTUP_TIMEOUT, "Ready")
    assert replicas(cluster) == 1
    async with load([cluster.service_url(NAME)], clients=4) as answered:
        started = time.monotonic()
        await cluster.wait_for(lambda: replicas(cluster) >= 2, 30, "scaled out within 30 s")
        took = time.monotonic() - started
        # The status follows the scale write, within a tick.
        status = await cluster.wait_for(
            lambda: (
                cluster.get("LLMService", NAME)["status"]["autoscaling"]["lastDecision"]
                and cluster.get("LLMService", NAME)["status"]["autoscaling"]
            ),
            10,
            "the decision in the status",
        )
        assert status["lastDecision"]["from"] == 1 and status["lastDecision"]["to"] == 2
        assert status["lastDecision"]["reason"] in {"Panic", "AboveTarget"}
        # The Deployment follows the LLMService's scale and a second runtime
        # starts. (Whether it turns Ready while two CPU-bound runtimes share a
        # loaded build machine is the harness's business, not the autoscaler's.)
        await cluster.wait_for(
            lambda: cluster.get("Deployment", NAME)["spec"]["replicas"] == 2,
            30,
            "the Deployment at 2 replicas",
        )
        await cluster.wait_for(
            lambda: len([p for p in cluster.pods(NAME) if p.pid]) == 2,
            30,
            "a second runtime process",
        )
        await cluster.wait_for(lambda: 200 in answered, STARTUP_TIMEOUT, "an answered request")
    stopped = time.monotonic()
    await cluster.wait_for(lambda: replicas(cluster) == 1, 90, "scaled back in to 1")
    idle = time.monotonic() - stopped
    assert idle >= SCALE_DOWN_WINDOW, f"scaled in {idle:.1f}s after the load, inside the window"
    status = await cluster.wait_for(
        lambda: (
            cluster.get("LLMService", NAME)["status"]["autoscaling"]["lastDecision"]["to"] == 1
            and cluster.get("LLMService", NAME)["status"]["autoscaling"]
        ),
        10,
        "the scale-in in the status",
    )
    assert status["lastDecision"]["from"] == 2
    assert status["desiredReplicas"] == 1 and status["queueDepth"] == 0
    scaling = cluster.condition(NAME, "ScalingActive")
    assert scaling is not None and scaling["status"] == "True"
    (up,) = await cluster.wait_for_events("ScaledUp")
    (down,) = await cluster.wait_for_events("ScaledDown")
    assert "1 -> 2 replicas" in up["message"] and "2 -> 1 replicas" in down["message"]
    print(f"scaled out {took:.1f}s after the load began; in {idle:.1f}s after it stopped")


async def test_a_pod_whose_metrics_die_is_skipped_not_counted_idle(cluster: Cluster) -> None:
    # Demand is counted in running requests (one per busy pod); the queue
    # target is out of reach. Two busy pods: two replicas' worth. The bounds
    # hold two replicas until the load runs, then allow one.
    body = autoscaled(targetQueueDepth=100, targetRunningRequests=1, minReplicas=2)
    body["spec"]["replicas"] = 2
    await cluster.create(body)
    pods = await cluster.wait_for(
        lambda: len(cluster.ready_pods(NAME)) == 2 and cluster.ready_pods(NAME),
        STARTUP_TIMEOUT,
        "two ready runtimes",
    )
    # Two clients per pod: one request runs, one waits, all the time.
    async with load([p.url for p in pods], clients=4) as answered:
        await cluster.wait_for(
            lambda: (
                (cluster.get("LLMService", NAME)["status"].get("autoscaling") or {}).get(
                    "runningRequests"
                )
                == 2
            ),
            30,
            "both pods measured busy",
        )
        # The runtimes' counters, read twice, give the arrival rate and the
        # time in the batch (some requests have finished by now or soon).
        auto = await cluster.wait_for(
            lambda: (
                (a := cluster.get("LLMService", NAME)["status"]["autoscaling"]).get("arrivalRate")
                and a.get("serviceTimeSeconds")
                and a
            ),
            60,
            "an arrival rate and a time in the batch",
        )
        assert auto["arrivalRate"] > 0 and auto["serviceTimeSeconds"] > 0
        await cluster.patch("LLMService", NAME, {"spec": {"autoscaling": {"minReplicas": 1}}})
        cluster.kill_metrics(pods[1])
        # Counted as idle, the silent pod would halve the demand and one
        # replica would go after the window; skipped, nothing moves.
        watch_until = time.monotonic() + 6 + SCALE_DOWN_WINDOW + 6
        seen = set()
        while time.monotonic() < watch_until:
            seen.add(replicas(cluster))
            await asyncio.sleep(0.5)
        auto = cluster.get("LLMService", NAME)["status"].get("autoscaling")
        assert seen == {2}, auto
        status = copy.deepcopy(cluster.get("LLMService", NAME)["status"])
        assert answered.count(200) > 0
    auto = status["autoscaling"]
    assert auto["podsUnanswered"] == 1 and auto["podsMeasured"] == 1
    scaling = cluster.condition(NAME, "ScalingActive")
    assert scaling is not None and scaling["reason"] == "PartialMetrics", scaling
    assert pods[1].name in scaling["message"]
    warnings = await cluster.wait_for_events("MetricsUnavailable")
    assert warnings and pods[1].name in warnings[0]["message"]
    assert cluster.is_ready(NAME)  # the pod itself serves on: only its metrics are gone
