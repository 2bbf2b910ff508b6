"""The adapter loop: plans, per-adapter status, the condition, Events, retries,
the spec generation every call carries, and the admin port and key it calls with."""

from __future__ import annotations

from typing import Any

import aiohttp.web
import pytest
from kubesim.http import serve_app
from pagoda.operator.adapters import (
    FAILURE_THRESHOLD,
    MAX_AUTH_BACKOFF,
    AdapterSync,
    Health,
    HttpPodClient,
    PodCallError,
    admin_url,
    auth_backoff,
    plan,
    summarize,
)
from pagoda.operator.config import OperatorConfig
from pagoda.operator.errors import ApiError
from pagoda.operator.llmservice import parse
from pagoda.operator.render.secret import render_admin_secret


def test_plan_loads_the_missing_replaces_the_moved_and_unloads_the_rest() -> None:
    todo = plan({"a": "/a", "b": "/b2", "c": "/c"}, {"b": "/b1", "c": "/c", "old": "/o"})
    assert todo.load == (("a", "/a"), ("b", "/b2"))
    assert todo.unload == ("old",)
    assert plan({"a": "/a"}, {"a": "/a"}) == plan({}, {})


def test_summary_counts_ready_and_failed_pods_per_adapter() -> None:
    desired = {"a": "/a", "b": "/b"}
    pods = {"p1": {"a": "/a", "b": "/b"}, "p2": {"a": "/a"}, "p3": None}
    entries, health = summarize(desired, pods, {("p2", "b"): "rank 32 above 16"})
    assert entries == [
        {"name": "a", "readyPods": 2, "failedPods": 0, "message": ""},
        {"name": "b", "readyPods": 1, "failedPods": 1, "message": "pod p2: rank 32 above 16"},
    ]
    assert (health.ready, health.reason) == (False, "AdapterFailed")
    assert "adapter b on pod p2: rank 32 above 16" in health.message


def test_summary_reasons() -> None:
    desired = {"a": "/a"}
    assert summarize(desired, {}, {})[1].reason == "NoReadyPods"
    assert summarize(desired, {"p": {}}, {})[1].reason == "Loading"
    done = summarize(desired, {"p": {"a": "/a"}, "q": {"a": "/a"}}, {})[1]
    assert (done.ready, done.reason, done.message) == (
        True,
        "AdaptersLoaded",
        "1 adapters on 2 ready pods",
    )
    # A pod serving another folder under the name does not count.
    assert summarize(desired, {"p": {"a": "/elsewhere"}}, {})[1].reason == "Loading"


def pod(name: str, ip: str, ready: bool = True) -> dict[str, Any]:
    ports = [{"name": "http", "containerPort": 8000}, {"name": "admin", "containerPort": 8001}]
    return {
        "metadata": {"name": name, "annotations": {"prometheus.io/port": "8000"}},
        "spec": {"containers": [{"name": "runtime", "ports": ports}]},
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


KEY = "the-admin-key"


class FakeApi:
    def __init__(self, pods: list[dict[str, Any]], key: str | None = KEY) -> None:
        self.pods = pods
        self.statuses: list[dict[str, Any]] = []
        self.secret = None if key is None else render_admin_secret(service(), key)
        self.secret_error: ApiError | None = None
        self.secret_reads = 0

    async def list(self, kind: str, namespace: str, labels: Any) -> list[dict[str, Any]]:
        return self.pods

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert (kind, namespace, name) == ("Secret", "ns", "chat-admin")
        self.secret_reads += 1
        if self.secret_error is not None:
            raise self.secret_error
        return self.secret

    async def patch_status(self, namespace: str, name: str, changes: dict[str, Any]) -> None:
        self.statuses.append(changes)


class FakePods:
    """Pods' admin APIs by URL; `refuse` maps a path to the runtime's error;
    `keys` maps a URL to the admin key its pod holds (default KEY)."""

    def __init__(self, refuse: dict[str, str] | None = None) -> None:
        self.loaded: dict[str, dict[str, str]] = {}
        self.refuse = refuse or {}
        self.calls: list[tuple[str, str, str]] = []
        self.generations: list[int | None] = []  # the generation of each call
        self.down: set[str] = set()
        self.keys: dict[str, str] = {}
        self.keys_sent: list[str | None] = []

    def _check(self, url: str, key: str | None) -> None:
        self.keys_sent.append(key)
        if key != self.keys.get(url, KEY):
            raise PodCallError("invalid or missing admin key", 401)

    async def models(self, url: str, *, key: str | None) -> dict[str, str]:
        if url in self.down:
            raise PodCallError(f"{url}: connection refused")
        self._check(url, key)
        return dict(self.loaded.setdefault(url, {}))

    async def load(
        self, url: str, name: str, path: str, *, generation: int | None, key: str | None
    ) -> None:
        self._check(url, key)
        self.calls.append(("load", url, name))
        self.generations.append(generation)
        if path in self.refuse:
            raise PodCallError(self.refuse[path], 400)
        self.loaded.setdefault(url, {})[name] = path

    async def unload(self, url: str, name: str, *, generation: int | None, key: str | None) -> None:
        self._check(url, key)
        self.calls.append(("unload", url, name))
        self.generations.append(generation)
        self.loaded.get(url, {}).pop(name, None)


def service(*adapters: tuple[str, str], generation: int | None = None) -> Any:
    spec = {
        "model": "smollm2-135m-instruct",
        "adapters": [{"name": n, "source": s} for n, s in adapters],
    }
    meta: dict[str, Any] = {"name": "chat", "namespace": "ns"}
    if generation is not None:
        meta["generation"] = generation
    return parse({"metadata": meta, "spec": spec}, OperatorConfig())


# The admin port: the adapter routes are not on the public one.
URL1, URL2 = "http://10.0.0.1:8001", "http://10.0.0.2:8001"


async def test_a_pass_loads_everywhere_then_has_nothing_to_do() -> None:
    api, pods = (
        FakeApi([pod("p1", "10.0.0.1"), pod("p2", "10.0.0.2"), pod("p3", "10.0.0.3", ready=False)]),
        FakePods(),
    )
    sync = AdapterSync(api, pods)  # type: ignore[arg-type]
    llms = service(("sql", "/adapters/sql"))
    first = await sync.tick(llms, {})
    assert sorted(pods.calls) == [("load", URL1, "sql"), ("load", URL2, "sql")]
    assert [e[1] for e in first.events] == ["AdapterLoaded", "AdapterLoaded"]
    assert first.converged and first.health.reason == "AdaptersLoaded"
    assert api.statuses == [
        {"adapters": [{"name": "sql", "readyPods": 2, "failedPods": 0, "message": ""}]}
    ]
    pods.calls.clear()
    second = await sync.tick(llms, {})
    assert pods.calls == [] and second.events == [] and len(api.statuses) == 1  # no write


async def test_a_removed_adapter_is_unloaded_from_every_pod() -> None:
    api, pods = FakeApi([pod("p1", "10.0.0.1")]), FakePods()
    sync = AdapterSync(api, pods)  # type: ignore[arg-type]
    await sync.tick(service(("a", "/a"), ("b", "/b")), {})
    result = await sync.tick(service(("a", "/a")), {})
    assert pods.loaded[URL1] == {"a": "/a"}
    assert [e[1] for e in result.events] == ["AdapterUnloaded"]
    assert api.statuses[-1] == {
        "adapters": [{"name": "a", "readyPods": 1, "failedPods": 0, "message": ""}]
    }


async def test_a_refused_adapter_fails_after_the_threshold_with_one_warning() -> None:
    api = FakeApi([pod("p1", "10.0.0.1")])
    pods = FakePods(refuse={"/bad": "adapter rank 64 is above --max-lora-rank 16"})
    sync = AdapterSync(api, pods)  # type: ignore[arg-type]
    llms = service(("good", "/good"), ("bad", "/bad"))
    warnings = []
    for attempt in range(1, FAILURE_THRESHOLD + 3):
        result = await sync.tick(llms, {})
        warnings += [e for e in result.events if e[0] == "Warning"]
        if attempt < FAILURE_THRESHOLD:
            assert result.health.reason == "Loading"
    assert result.health.reason == "AdapterFailed" and not result.converged
    assert "rank 64 is above --max-lora-rank 16" in result.health.message
    assert len(warnings) == 1 and warnings[0][1] == "AdapterFailed"
    assert api.statuses[-1]["adapters"][1] == {
        "name": "bad",
        "readyPods": 0,
        "failedPods": 1,
        "message": "pod p1: adapter rank 64 is above --max-lora-rank 16",
    }
    assert pods.loaded[URL1] == {"good": "/good"}  # the others are served
    # Fixed in the spec: the failure is forgotten.
    fixed = await sync.tick(service(("good", "/good")), {})
    assert fixed.health.reason == "AdaptersLoaded"


async def test_an_unreachable_pod_is_not_counted_as_failed() -> None:
    api, pods = FakeApi([pod("p1", "10.0.0.1"), pod("p2", "10.0.0.2")]), FakePods()
    pods.down.add(URL2)
    sync = AdapterSync(api, pods)  # type: ignore[arg-type]
    for _ in range(FAILURE_THRESHOLD + 1):
        result = await sync.tick(service(("a", "/a")), {})
    assert result.health.reason == "Loading"
    assert api.statuses[-1]["adapters"] == [
        {"name": "a", "readyPods": 1, "failedPods": 0, "message": ""}
    ]


async def test_every_call_carries_the_generation_of_the_spec_it_acts_for() -> None:
    # The pod skips an adapters file older than a call it has applied: the
    # file that still lists "b" after its removal must not load it again.
    api, pods = FakeApi([pod("p1", "10.0.0.1")]), FakePods()
    sync = AdapterSync(api, pods)  # type: ignore[arg-type]
    await sync.tick(service(("a", "/a"), ("b", "/b"), generation=2), {})
    await sync.tick(service(("a", "/a2"), generation=3), {})
    assert pods.calls == [
        ("load", URL1, "a"),
        ("load", URL1, "b"),
        ("unload", URL1, "b"),
        ("load", URL1, "a"),
    ]
    assert pods.generations == [2, 2, 3, 3]


async def test_a_spec_without_a_generation_sends_none() -> None:
    api, pods = FakeApi([pod("p1", "10.0.0.1")]), FakePods()
    await AdapterSync(api, pods).tick(service(("a", "/a")), {})  # type: ignore[arg-type]
    assert pods.generations == [None]


async def test_the_http_client_sends_the_generation_with_vllms_fields() -> None:
    bodies: list[tuple[str, dict[str, Any]]] = []

    async def record(request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = await request.json()
        bodies.append((request.path, body))
        if body["lora_name"] == "gone":  # the pod's file got there first
            error = {"error": {"message": "no LoRA adapter named 'gone'", "code": 404}}
            return aiohttp.web.json_response(error, status=404)
        return aiohttp.web.json_response({"lora_name": body["lora_name"], "status": "ok"})

    app = aiohttp.web.Application()
    app.router.add_post("/v1/load_lora_adapter", record)
    app.router.add_post("/v1/unload_lora_adapter", record)
    client = HttpPodClient(timeout=5)
    async with serve_app(app) as url:
        try:
            await client.load(url, "sql", "/a/sql", generation=7, key=None)
            await client.unload(url, "sql", generation=8, key=None)
            await client.unload(url, "gone", generation=8, key=None)  # a 404 is not an error
            await client.load(url, "sql", "/a/sql", generation=None, key=None)
        finally:
            await client.close()
    assert bodies == [
        (
            "/v1/load_lora_adapter",
            {"lora_name": "sql", "lora_path": "/a/sql", "replace": True, "generation": 7},
        ),
        ("/v1/unload_lora_adapter", {"lora_name": "sql", "generation": 8}),
        ("/v1/unload_lora_adapter", {"lora_name": "gone", "generation": 8}),
        # Unknown: left out, not null (the pod then orders nothing by it).
        ("/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": "/a/sql", "replace": True}),
    ]


@pytest.mark.parametrize(
    ("adapters", "model", "path"),
    [
        ([("a", "pvc://models/loras/a")], "pvc://models/base", "/mnt/models/loras/a"),
        ([("a", "pvc://loras/a")], "smollm2-135m-instruct", "/mnt/adapters/loras/a"),
        ([("a", "/opt/a")], "smollm2-135m-instruct", "/opt/a"),
    ],
)
def test_sources_become_paths_inside_the_pod(adapters, model, path) -> None:
    from pagoda.operator.adapters import desired_adapters

    spec = {"model": model, "adapters": [{"name": n, "source": s} for n, s in adapters]}
    llms = parse({"metadata": {"name": "chat", "namespace": "ns"}, "spec": spec}, OperatorConfig())
    assert desired_adapters(llms) == {"a": path}


async def test_every_call_goes_to_the_admin_port_with_the_secrets_key() -> None:
    api, pods = FakeApi([pod("p1", "10.0.0.1")]), FakePods()
    sync = AdapterSync(api, pods)  # type: ignore[arg-type]
    await sync.tick(service(("a", "/a"), ("b", "/b")), {})
    result = await sync.tick(service(("a", "/a")), {})
    assert result.converged and result.retry_after is None
    assert [c[1] for c in pods.calls] == [URL1] * 3
    assert pods.keys_sent and set(pods.keys_sent) == {KEY}
    assert api.secret_reads == 1  # read once, kept while pods accept it


async def test_a_refused_key_is_a_condition_and_one_warning_and_backs_off() -> None:
    api, pods = FakeApi([pod("p1", "10.0.0.1"), pod("p2", "10.0.0.2")]), FakePods()
    pods.keys[URL2] = "the-key-p2-started-with"
    sync = AdapterSync(api, pods)  # type: ignore[arg-type]
    llms = service(("a", "/a"))
    results = [await sync.tick(llms, {}) for _ in range(4)]
    warnings = [e for r in results for e in r.events if e[0] == "Warning"]
    assert [w[1] for w in warnings] == ["AdminKeyRejected"]
    assert "pod p2 refused the admin key of Secret chat-admin" in warnings[0][2]
    last = results[-1]
    assert (last.health.ready, last.health.reason, last.converged) == (
        False,
        "AdminKeyRejected",
        False,
    )
    assert "invalid or missing admin key" in last.health.message
    # Not a one-second spin: each pass waits about twice as long as the last.
    waits = [r.retry_after for r in results]
    assert [int(w) for w in waits] == [1, 2, 4, 8]  # plus at most 10% jitter
    # The pod that accepts the key is served all along; the key is re-read each time.
    assert pods.loaded[URL1] == {"a": "/a"} and api.secret_reads == 4
    # p2 restarted with the Secret's key: converged, back to the normal pace.
    pods.keys.pop(URL2)
    healed = await sync.tick(llms, {})
    assert healed.converged and healed.retry_after is None
    assert pods.loaded[URL2] == {"a": "/a"}
    assert (sync.auth_failures, sync.rejected) == (0, {})


async def test_an_unreadable_secret_backs_off_without_calling_pods() -> None:
    api, pods = FakeApi([pod("p1", "10.0.0.1")]), FakePods()
    api.secret_error = ApiError(403, "Forbidden", "secrets is forbidden")
    sync = AdapterSync(api, pods)  # type: ignore[arg-type]
    result = await sync.tick(service(("a", "/a")), {})
    assert result.health.reason == "AdminKeyUnreadable" and result.retry_after is not None
    assert "cannot read Secret chat-admin" in result.health.message
    assert pods.keys_sent == []
    api.secret_error = ApiError(503, "ServiceUnavailable", "etcd")
    with pytest.raises(ApiError):  # transient: the caller retries as usual
        await sync.tick(service(("a", "/a")), {})


def test_the_auth_back_off_doubles_up_to_its_cap_with_a_little_jitter() -> None:
    import random

    rng = random.Random(7)
    waits = [auth_backoff(n, rng) for n in range(1, 14)]
    for n, wait in enumerate(waits, 1):
        base = min(MAX_AUTH_BACKOFF, 2.0 ** (n - 1))
        assert base <= wait <= base * 1.1
    assert waits[-1] <= MAX_AUTH_BACKOFF * 1.1


def test_the_admin_url_is_the_pods_admin_port() -> None:
    assert admin_url(pod("p", "10.0.0.1")) == "http://10.0.0.1:8001"
    v6 = pod("p", "fd00::1")
    assert admin_url(v6) == "http://[fd00::1]:8001"
    # A pod of an older template, without the admin port: its HTTP port.
    old = pod("p", "10.0.0.1")
    old["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8000}]
    assert admin_url(old) == "http://10.0.0.1:8000"
    assert admin_url(pod("p", "")) is None


async def test_the_http_client_sends_the_key_as_a_bearer_token() -> None:
    seen: list[tuple[str, str | None]] = []

    async def record(request: aiohttp.web.Request) -> aiohttp.web.Response:
        seen.append((request.path, request.headers.get("Authorization")))
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            error = {"error": {"message": "invalid or missing admin key", "code": 401}}
            return aiohttp.web.json_response(error, status=401)
        if request.method == "GET":
            return aiohttp.web.json_response({"object": "list", "data": []})
        return aiohttp.web.json_response({"status": "ok"})

    app = aiohttp.web.Application()
    app.router.add_get("/v1/models", record)
    app.router.add_post("/v1/load_lora_adapter", record)
    app.router.add_post("/v1/unload_lora_adapter", record)
    client = HttpPodClient(timeout=5)
    async with serve_app(app) as url:
        try:
            assert await client.models(url, key=KEY) == {}
            await client.load(url, "sql", "/a/sql", generation=1, key=KEY)
            await client.unload(url, "sql", generation=1, key=KEY)
            with pytest.raises(PodCallError) as refused:
                await client.models(url, key="wrong")
        finally:
            await client.close()
    assert seen[:3] == [
        ("/v1/models", f"Bearer {KEY}"),
        ("/v1/load_lora_adapter", f"Bearer {KEY}"),
        ("/v1/unload_lora_adapter", f"Bearer {KEY}"),
    ]
    assert refused.value.status == 401 and "invalid or missing admin key" in str(refused.value)


def test_a_health_found_for_another_adapter_list_is_loading() -> None:
    # AdaptersReady must not stay True for the old list until the loop's next pass.
    before = service(("sql", "/a"))
    health = Health(True, "AdaptersLoaded", "1 adapters on 1 ready pods", (("sql", "/a"),))
    assert health.for_spec(before) is health
    after = service(("sql", "/a"), ("code", "/b"))
    stale = health.for_spec(after)
    assert (stale.ready, stale.reason) == (False, "Loading")
    unknown = Health(None, "NoReadyPods", "no ready pod")  # not tied to a list
    assert unknown.for_spec(after) is unknown
