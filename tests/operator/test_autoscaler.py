"""One autoscaler tick, around the pure scaler: sorting pods, status, Events, refusals."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pagoda.operator import metrics
from pagoda.operator.autoscaler import Autoscaler, census, failure_events, health, observation
from pagoda.operator.config import OperatorConfig
from pagoda.operator.errors import ApiError
from pagoda.operator.llmservice import parse
from pagoda.operator.scaler import PodSample
from pagoda.operator.scrape import ScrapeError

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)


def pod(
    name: str,
    ready: bool = True,
    age: float = 600,
    waiting: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    created = (NOW - datetime.timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = created
    status: dict[str, Any] = {
        "podIP": f"10.0.0.{len(name)}",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if waiting:
        status["containerStatuses"] = [{"state": {"waiting": {"reason": waiting}}}]
    return {"metadata": meta, "status": status}


def test_census_counts_loading_pods_as_capacity_coming_and_stuck_ones_not() -> None:
    seen = census(
        [
            pod("ready"),
            pod("loading", ready=False, age=30),
            pod("crashing", ready=False, age=30, waiting="CrashLoopBackOff"),
            pod("stuck", ready=False, age=4000),  # past the startup budget: never coming
            pod("leaving", deleting=True),
        ],
        NOW,
        startup_budget=1800,
    )
    assert [t.pod for t in seen.targets] == ["ready"]
    assert seen.starting == 1


def test_failed_scrapes_are_left_out_of_the_observation() -> None:
    seen = census([pod("a"), pod("bb")], NOW, 1800)
    results = {"a": PodSample(queue=3), "bb": ScrapeError("Timeout", "no answer")}
    obs = observation(10.0, 2, seen, results)
    assert obs.samples == (PodSample(queue=3),) and obs.ready == 2 and obs.unanswered == 1
    assert health(obs, results).reason == "PartialMetrics"
    none = observation(10.0, 2, seen, {"a": results["bb"], "bb": results["bb"]})
    verdict = health(none, {"a": results["bb"], "bb": results["bb"]})
    assert (verdict.active, verdict.reason) == (False, "MetricsUnavailable")


def test_a_failing_pod_is_told_once_not_every_tick() -> None:
    now = {"a": ScrapeError("Malformed", "no vllm:num_requests_waiting series")}
    (event,) = failure_events(now, {})
    assert event[:2] == ("Warning", "MetricsMalformed") and "pod a" in event[2]
    assert failure_events(now, {"a": "Malformed"}) == []
    assert failure_events({"a": ScrapeError("Timeout", "")}, {"a": "Malformed"}) != []


class FakeApi:
    """The calls a tick makes, recorded.

    `refuse` makes the scale write fail with that status; `race` is a count
    someone else writes between the tick's read and its write. The scale
    write's precondition on the count is checked as the API server checks a
    JSON patch `test`: a 422 when the count moved.
    """

    def __init__(
        self,
        replicas: int,
        pods: list[dict[str, Any]],
        refuse: int | None = None,
        race: int | None = None,
    ):
        self.replicas = replicas
        self.pods = pods
        self.refuse = refuse
        self.race = race
        self.scaled: list[tuple[int, int]] = []
        self.statuses: list[dict[str, Any]] = []

    async def get_scale(self, namespace: str, name: str) -> dict[str, Any]:
        return {"spec": {"replicas": self.replicas} if self.replicas else {}}

    async def list(self, kind: str, namespace: str, labels: Any) -> list[dict[str, Any]]:
        return self.pods

    async def patch_scale(self, ns: str, name: str, replicas: int, expected: int) -> None:
        if self.race is not None:
            self.replicas, self.race = self.race, None
        if self.replicas != expected:
            raise ApiError(422, "Invalid", "test operation failed", "scale")
        if self.refuse:
            raise ApiError(self.refuse, "Invalid", "replicas out of range", "scale")
        self.scaled.append((replicas, expected))
        self.replicas = replicas

    async def patch_status(self, namespace: str, name: str, changes: dict[str, Any]) -> None:
        self.statuses.append(changes)


def service(**autoscaling: Any) -> Any:
    body = {
        "metadata": {"name": "chat", "namespace": "ns", "uid": "u"},
        "spec": {
            "model": "smollm2-135m-instruct",
            "autoscaling": {"maxReplicas": 4, "targetQueueDepth": 2, **autoscaling},
        },
    }
    return parse(body, OperatorConfig())


def pages(text_by_pod: dict[str, str]) -> Any:
    async def fetch(url: str, timeout: float) -> str:
        host = url.split("//")[1].split(":")[0]
        for name, text in text_by_pod.items():
            if host == f"10.0.0.{len(name)}":
                if text == "refused":
                    raise ScrapeError("Unreachable", "connection refused")
                return text
        raise AssertionError(url)

    return fetch


async def test_a_queue_is_scaled_through_the_scale_subresource_with_an_event() -> None:
    api = FakeApi(1, [pod("a")])
    scaler = Autoscaler(api, pages({"a": "vllm:num_requests_waiting 8\n"}))  # type: ignore[arg-type]
    ups = metrics.SCALE_DECISIONS.labels("up", "Panic")
    before = ups._value.get()
    result = await scaler.tick(service(), {}, 0.0, NOW)
    assert ups._value.get() == before + 1  # the operator's metric, by direction
    assert api.scaled == [(4, 1)]  # 4 replicas' worth, if the count is still the 1 read
    assert result.events[0][:2] == ("Normal", "ScaledUp")
    status = api.statuses[-1]["autoscaling"]
    assert status["queueDepth"] == 8 and status["desiredReplicas"] == 4
    assert status["lastDecision"]["from"] == 1 and status["lastDecision"]["to"] == 4
    assert status["lastScaleTime"] == "2026-01-01T12:00:00Z"
    # Nothing new next tick: no status write at all.
    await scaler.tick(service(), {}, 5.0, NOW)
    written = len(api.statuses)
    await scaler.tick(service(), {}, 10.0, NOW)
    assert len(api.statuses) == written


@pytest.mark.parametrize("text", ["garbage {", "refused", "vllm:num_requests_waiting -3\n"])
async def test_bad_metrics_give_a_warning_and_hold_never_a_crash(text: str) -> None:
    api = FakeApi(2, [pod("a"), pod("bb")])
    scaler = Autoscaler(api, pages({"a": text, "bb": text}))  # type: ignore[arg-type]
    reason = "Unreachable" if text == "refused" else "Malformed"
    failures = metrics.SCRAPE_FAILURES.labels(reason)
    before = failures._value.get()
    for tick in range(20):
        result = await scaler.tick(service(), {}, tick * 5.0, NOW)
        if tick == 0:
            assert [e[0] for e in result.events] == ["Warning", "Warning"]
        assert result.health is not None and result.health.reason == "MetricsUnavailable"
    assert api.scaled == []  # 100 s without data: nothing removed
    assert failures._value.get() == before + 40  # every failed read is counted
    assert api.statuses[-1]["autoscaling"]["podsUnanswered"] == 2


async def test_a_refused_scale_write_is_a_warning_and_an_inactive_condition() -> None:
    api = FakeApi(1, [pod("a")], refuse=422)
    scaler = Autoscaler(api, pages({"a": "vllm:num_requests_waiting 8\n"}))  # type: ignore[arg-type]
    result = await scaler.tick(service(), {}, 0.0, NOW)
    assert ("Warning", "ScaleRefused") in [e[:2] for e in result.events]
    assert result.health is not None and result.health.reason == "ScaleRefused"
    assert "lastDecision" not in api.statuses[-1]["autoscaling"] or (
        api.statuses[-1]["autoscaling"]["lastDecision"] is None
    )


async def test_a_count_someone_else_wrote_meanwhile_stands_without_a_warning() -> None:
    api = FakeApi(1, [pod("a")], race=3)  # kubectl scale 3, between the read and the write
    scaler = Autoscaler(api, pages({"a": "vllm:num_requests_waiting 8\n"}))  # type: ignore[arg-type]
    result = await scaler.tick(service(), {}, 0.0, NOW)
    assert api.scaled == [] and api.replicas == 3  # their count is not overwritten
    assert not any(e[0] == "Warning" for e in result.events)
    assert scaler.state.decided == 1  # the decision not written is not recorded


async def test_a_scale_write_that_failed_is_not_recorded_as_the_scalers_count() -> None:
    # A write that failed for a reason of its own (here a conflict, as a
    # concurrent status write gave with resourceVersion preconditions) must
    # not be read next tick as someone else's scale: that would wipe the
    # stabilization history and end the panic.
    api = FakeApi(1, [pod("a")], refuse=409)
    scaler = Autoscaler(api, pages({"a": "vllm:num_requests_waiting 8\n"}))  # type: ignore[arg-type]
    with pytest.raises(ApiError):
        await scaler.tick(service(), {}, 0.0, NOW)
    assert scaler.state.decided != 4
    api.refuse = 422
    await scaler.tick(service(), {}, 5.0, NOW)
    assert scaler.state.decided == 1 and scaler.state.since == 5.0
    api.refuse = None
    result = await scaler.tick(service(), {}, 10.0, NOW)
    assert api.scaled == [(4, 1)]
    assert result.decision is not None and result.decision.panic
    assert scaler.state.since == 5.0  # the history of the ticks before is kept


async def test_a_refused_scale_write_is_told_once_not_every_tick() -> None:
    api = FakeApi(1, [pod("a")], refuse=422)
    scaler = Autoscaler(api, pages({"a": "vllm:num_requests_waiting 8\n"}))  # type: ignore[arg-type]
    told = []
    for tick in range(20):
        result = await scaler.tick(service(), {}, tick * 5.0, NOW)
        told += [e for e in result.events if e[1] == "ScaleRefused"]
        assert result.health is not None and result.health.reason == "ScaleRefused"
    assert len(told) == 1


async def test_a_count_above_a_lowered_max_is_brought_within_the_bounds_with_an_event() -> None:
    api = FakeApi(6, [pod(f"p{i}") for i in range(6)])  # maxReplicas lowered to 4 by GitOps
    text = {f"p{i}": "vllm:num_requests_waiting 1\n" for i in range(6)}
    scaler = Autoscaler(api, pages(text))  # type: ignore[arg-type]
    result = await scaler.tick(service(), {}, 0.0, NOW)
    assert api.scaled == [(4, 6)]
    assert result.events[-1][:2] == ("Normal", "ScaledDown")
    assert "AboveMaxReplicas" in result.events[-1][2]
    assert api.statuses[-1]["autoscaling"]["lastDecision"]["reason"] == "AboveMaxReplicas"


async def test_a_count_below_min_is_raised_even_with_no_pod_to_measure() -> None:
    api = FakeApi(0, [])
    scaler = Autoscaler(api, pages({}))  # type: ignore[arg-type]
    result = await scaler.tick(service(minReplicas=2), {}, 0.0, NOW)
    assert api.scaled == [(2, 0)]
    assert "BelowMinReplicas" in result.events[-1][2]


async def test_gauges_are_refreshed_at_most_every_interval_and_decisions_at_once() -> None:
    api = FakeApi(2, [pod("a"), pod("bb")])
    text = {"a": "vllm:num_requests_waiting 1\n", "bb": "vllm:num_requests_waiting 1\n"}
    scaler = Autoscaler(api, pages(text))  # type: ignore[arg-type]
    await scaler.tick(service(), {}, 0.0, NOW)
    assert len(api.statuses) == 1
    for tick in range(1, 6):  # 25 s of a queue that moves every tick
        text["a"] = f"vllm:num_requests_waiting {1 + tick % 2}\n"
        await scaler.tick(service(), {}, tick * 5.0, NOW)
    assert len(api.statuses) == 1
    await scaler.tick(service(), {}, 30.0, NOW)  # the gauges' refresh is due
    assert len(api.statuses) == 2
    text["a"] = "refused"  # a count changes: written at once
    await scaler.tick(service(), {}, 35.0, NOW)
    assert len(api.statuses) == 3 and api.statuses[-1]["autoscaling"]["podsUnanswered"] == 1


async def test_a_transient_error_propagates_for_the_loop_to_log() -> None:
    api = FakeApi(1, [pod("a")], refuse=503)
    scaler = Autoscaler(api, pages({"a": "vllm:num_requests_waiting 8\n"}))  # type: ignore[arg-type]
    with pytest.raises(ApiError):
        await scaler.tick(service(), {}, 0.0, NOW)


def exposition(waiting: float, received: float, finished: float, busy: float) -> str:
    return (
        f"vllm:num_requests_waiting {waiting}\n"
        f"pagoda:requests_received_total {received}\n"
        f"vllm:request_inference_time_seconds_count {finished}\n"
        f"vllm:request_inference_time_seconds_sum {busy}\n"
    )


async def test_arrivals_come_from_two_readings_of_a_pod_and_reach_the_status() -> None:
    api = FakeApi(1, [pod("a")])
    text = {"a": exposition(0, 100, 90, 900)}

    async def fetch(url: str, timeout: float) -> str:
        return text["a"]

    scaler = Autoscaler(api, fetch)  # type: ignore[arg-type]
    llms = service(targetRunningRequests=2)
    first = await scaler.tick(llms, {}, 0.0, NOW)
    assert first.decision is not None and first.decision.arrival_rate is None  # one reading
    assert api.statuses[-1]["autoscaling"]["arrivalRate"] is None
    text["a"] = exposition(0, 110, 95, 950)  # 10 in 5 s; 5 finished, 10 s each
    second = await scaler.tick(llms, {}, 5.0, NOW)
    assert second.decision is not None and second.decision.arrival_rate == 2.0
    status = api.statuses[-1]["autoscaling"]
    assert status["arrivalRate"] == 2.0 and status["serviceTimeSeconds"] == 10.0
    # 2 req/s x 10 s = 20 in the batch, 2 per replica: 10 replicas' worth.
    assert second.decision.demand == 10
    # The pod restarts (a new restart count): its counters start afresh, no rate.
    api.pods[0]["status"]["containerStatuses"] = [{"restartCount": 1}]
    text["a"] = exposition(0, 3, 1, 10)
    third = await scaler.tick(llms, {}, 10.0, NOW)
    assert third.decision is not None and third.decision.state.points[-1].arrivals is None


async def test_without_a_running_target_the_engines_batch_sizes_the_arrivals() -> None:
    body = {
        "metadata": {"name": "chat", "namespace": "ns", "uid": "u"},
        "spec": {
            "model": "smollm2-135m-instruct",
            "engine": {"maxNumSeqs": 5},
            "autoscaling": {"maxReplicas": 8},
        },
    }
    llms = parse(body, OperatorConfig())
    api = FakeApi(1, [pod("a")])
    text = {"a": exposition(0, 100, 90, 900)}

    async def fetch(url: str, timeout: float) -> str:
        return text["a"]

    scaler = Autoscaler(api, fetch)  # type: ignore[arg-type]
    await scaler.tick(llms, {}, 0.0, NOW)
    text["a"] = exposition(0, 110, 95, 950)
    result = await scaler.tick(llms, {}, 5.0, NOW)
    # 2 req/s x 10 s = 20 in the batch; full batches of 5: 4 replicas' worth.
    assert result.decision is not None and result.decision.demand == 4


async def test_with_the_watch_cache_a_tick_lists_no_pods_through_the_api() -> None:
    from pagoda.operator.cache import ChildCache

    class NoList(FakeApi):
        async def list(self, kind: str, namespace: str, labels: Any) -> list[dict[str, Any]]:
            raise AssertionError("listed through the API")

    cached = pod("a")
    cached["metadata"] |= {"namespace": "ns", "labels": {"app": "pagoda"}}
    cache = ChildCache({"Pod": {("ns", "a"): [cached]}})
    api = NoList(1, [])
    text = {"a": "vllm:num_requests_waiting 8\n"}
    scaler = Autoscaler(api, pages(text), cache=cache)  # type: ignore[arg-type]
    await scaler.tick(service(), {"app": "pagoda"}, 0.0, NOW)
    assert api.scaled == [(4, 1)]


# ---------------------------------------------------------------- against kubesim
async def _service_with_a_busy_pod(cluster: Any) -> Any:
    from kubesim.testing import create, llmservice, obj

    spec = {"replicas": 1, "autoscaling": {"maxReplicas": 4, "targetQueueDepth": 2}}
    await create(cluster, llmservice(**spec))
    busy = pod("busy")
    busy |= {"apiVersion": "v1", "kind": "Pod"}
    busy["metadata"] |= {"namespace": "llm", "labels": {"app": "pagoda"}}
    await create(cluster, busy)
    return parse(obj(cluster, "pagoda.dev/v1alpha1/llmservices", "chat"), OperatorConfig())


async def test_a_status_write_between_the_read_and_the_scale_write_does_not_stop_it(
    cluster: Any,
) -> None:
    from kubesim.testing import LLMS, NS, obj, patch, path_of, requests_to
    from pagoda.operator.api import KubeApi

    llms = await _service_with_a_busy_pod(cluster)

    async def fetch(url: str, timeout: float) -> str:
        # The sync loop writes the status while the autoscaler scrapes.
        await patch(cluster, path_of(LLMS, NS, "chat") + "/status", {"status": {"replicas": 1}})
        return "vllm:num_requests_waiting 8\n"

    api = KubeApi.from_environment()
    try:
        scaler = Autoscaler(api, fetch)
        result = await scaler.tick(llms, {"app": "pagoda"}, 0.0, NOW)
    finally:
        api.close()
    assert obj(cluster, LLMS, "chat")["spec"]["replicas"] == 4
    assert result.events[-1][:2] == ("Normal", "ScaledUp")
    (write,) = requests_to(cluster, "PATCH", "/llmservices/chat/scale")
    # The precondition is on the count, never on the resourceVersion the
    # status write just changed.
    assert write.data == [
        {"op": "test", "path": "/spec/replicas", "value": 1},
        {"op": "replace", "path": "/spec/replicas", "value": 4},
    ]


async def test_a_scale_by_someone_else_between_the_read_and_the_write_stands(
    cluster: Any,
) -> None:
    from kubesim.testing import LLMS, NS, obj, patch, path_of
    from pagoda.operator.api import KubeApi

    llms = await _service_with_a_busy_pod(cluster)

    async def fetch(url: str, timeout: float) -> str:
        await patch(cluster, path_of(LLMS, NS, "chat") + "/scale", {"spec": {"replicas": 3}})
        return "vllm:num_requests_waiting 8\n"

    api = KubeApi.from_environment()
    try:
        scaler = Autoscaler(api, fetch)
        result = await scaler.tick(llms, {"app": "pagoda"}, 0.0, NOW)
    finally:
        api.close()
    assert obj(cluster, LLMS, "chat")["spec"]["replicas"] == 3  # kubectl scale's count stands
    assert not any(e[0] == "Warning" for e in result.events)
    assert scaler.state.decided == 1
