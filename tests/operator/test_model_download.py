"""ModelReady: the pods' download init containers and their /progress, read by the operator."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from aiohttp import web
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import parse
from pagoda.operator.model_download import (
    PodDownload,
    Progress,
    parse_progress,
    pod_download,
    read_progress,
)
from pagoda.operator.pod_http import PodHttp
from pagoda.operator.render.deployment import TEMPLATE_HASH_ANNOTATION
from pagoda.operator.status import Observed, compute, transitions

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
HASH = "current"
MODEL = "hf://acme/tiny"
GIB = 1 << 30


def service(model: str = MODEL) -> Any:
    body = {
        "metadata": {"name": "chat", "namespace": "ml", "generation": 2},
        "spec": {"model": model},
    }
    return parse(body, OperatorConfig())


def pod(name: str, init: dict[str, Any] | None, template: str = HASH, ip: str = "10.0.0.1") -> dict:
    status: dict[str, Any] = {"podIP": ip, "conditions": []}
    if init is not None:
        status["initContainerStatuses"] = [{"name": "model-download", **init}]
    return {
        "metadata": {"name": name, "annotations": {TEMPLATE_HASH_ANNOTATION: template}},
        "spec": {
            "initContainers": [{"name": "model-download"}],
            "containers": [{"name": "runtime"}],
        },
        "status": status,
    }


RUNNING = {"state": {"running": {"startedAt": "x"}}}
DONE = {"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
REFUSED = "…\npagoda download: error: acme/tiny@main: the Hub refused the token (401): check hfTokenSecretRef"
CRASH_LOOP = {
    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
    "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": REFUSED}},
}


def full_status(
    *pods: dict, progress: dict[str, Progress] | None = None, model: str = MODEL
) -> dict[str, Any]:
    observed = Observed(
        {"metadata": {"generation": 1}, "status": {"observedGeneration": 1}},
        pods=pods,
        template_hash=HASH,
        download_progress=progress,
    )
    return compute(service(model), observed, "http://e/v1", "sel", {}, NOW)


def model_ready(*pods: dict, **kwargs: Any) -> dict[str, Any]:
    """The ModelReady condition, or {} when there is none."""
    found = [c for c in full_status(*pods, **kwargs)["conditions"] if c["type"] == "ModelReady"]
    return found[0] if found else {}


def test_downloading_pods_report_their_bytes_together() -> None:
    got = model_ready(
        pod("a", RUNNING),
        pod("b", RUNNING),
        progress={
            "a": Progress(int(2.1 * GIB), 7 * GIB),
            "b": Progress(1 * GIB, int(7.9 * GIB)),
        },
    )
    assert (got["status"], got["reason"]) == ("False", "Downloading")
    assert got["message"] == "hf://acme/tiny: 3.1 GiB of 14.9 GiB (20%) on 2 pods"


def test_a_download_not_read_yet_says_where_it_runs() -> None:
    got = model_ready(pod("a", RUNNING))
    assert got["message"] == "hf://acme/tiny: downloading on 1 pod"


def test_every_current_pod_downloaded_is_ready() -> None:
    got = model_ready(pod("a", DONE), pod("b", DONE), pod("old", RUNNING, template="old"))
    assert (got["status"], got["reason"]) == ("True", "Downloaded")
    assert got["message"] == "hf://acme/tiny is in the cache of 2 pods"


def test_a_failed_download_carries_the_init_containers_last_words_and_degrades() -> None:
    status = full_status(pod("a", CRASH_LOOP), pod("b", RUNNING))
    got = next(c for c in status["conditions"] if c["type"] == "ModelReady")
    assert (got["status"], got["reason"]) == ("False", "DownloadFailed")
    assert got["message"] == (
        "hf://acme/tiny: pod a: pagoda download: error: acme/tiny@main: the Hub refused "
        "the token (401): check hfTokenSecretRef"
    )
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "DownloadFailed")
    assert "401" in degraded["message"]


def test_a_download_that_exited_with_an_error_is_failed() -> None:
    terminated = {"state": {"terminated": {"exitCode": 1, "message": "disk full"}}}
    assert pod_download(pod("a", terminated)) == PodDownload("a", "Failed", "disk full")


def test_before_any_pod_starts_the_model_is_unknown() -> None:
    got = model_ready(
        pod("a", None), pod("b", {"state": {"waiting": {"reason": "PodInitializing"}}})
    )
    assert (got["status"], got["reason"]) == ("Unknown", "Pending")


def test_other_models_have_no_model_ready_condition() -> None:
    assert (
        model_ready(model="smollm2-135m-instruct")
        == model_ready(model="smollm2-135m-instruct") | {}
    )
    assert "type" not in model_ready(model="smollm2-135m-instruct")


def test_a_failed_download_is_a_warning_event_and_done_is_normal() -> None:
    failed = full_status(pod("a", CRASH_LOOP))
    done = full_status(pod("a", DONE))
    events = transitions(done, failed)
    assert ("Warning", "DownloadFailed") in [(kind, reason) for kind, reason, _ in events]
    assert ("Normal", "Downloaded") in [(k, r) for k, r, _ in transitions(failed, done)]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"bytesDone": 5, "bytesTotal": 10, "phase": "Downloading"}', Progress(5, 10)),
        (b'{"bytesDone": 50, "bytesTotal": 10}', Progress(10, 10)),
        (b'{"bytesDone": -1, "bytesTotal": 10}', None),
        (b"<html>", None),
        (b'{"bytesDone": "x"}', None),
    ],
)
def test_progress_answers_are_parsed_defensively(body: bytes, expected: Progress | None) -> None:
    assert parse_progress(body) == expected


async def test_progress_is_read_from_downloading_pods_only(unused_tcp_port_factory: Any) -> None:
    asked = []

    async def progress(request: web.Request) -> web.Response:
        asked.append(request.host)
        return web.json_response({"bytesDone": 1, "bytesTotal": 4})

    app = web.Application()
    app.router.add_get("/progress", progress)
    runner = web.AppRunner(app)
    await runner.setup()
    # The runtime's port on a loopback address of its own, as kubesim gives pods.
    site = web.TCPSite(runner, "127.0.0.77", 8000)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        pytest.skip("port 8000 on 127.0.0.77 is taken")
    http = PodHttp()
    try:
        got = await read_progress(
            [
                pod("a", RUNNING, ip="127.0.0.77"),
                pod("b", DONE, ip="127.0.0.77"),
                pod("c", RUNNING, ip="127.0.0.78"),  # nobody there: left out
            ],
            http,
            timeout=1.0,
        )
    finally:
        await http.close()
        await runner.cleanup()
    assert got == {"a": Progress(1, 4)}
    assert asked == ["127.0.0.77:8000"]


def test_progress_json_of_the_runtime_is_what_the_operator_reads() -> None:
    from pagoda.runtime.model_loader.hub_download import Progress as RuntimeProgress

    sent = RuntimeProgress("Downloading", "acme/tiny", "main", "abc", 10, 4, 3, 1)
    assert parse_progress(json.dumps(sent.to_json()).encode()) == Progress(4, 10)


class CountingReader:
    """A progress reader that reports one more GiB at each read (a download under way)."""

    def __init__(self) -> None:
        self.reads = 0

    async def __call__(self, pods: Any) -> dict[str, Progress]:
        self.reads += 1
        return {
            p["metadata"]["name"]: Progress(min(self.reads, 10) * GIB, 10 * GIB)
            for p in pods
            if pod_download(p) and pod_download(p).state == "Downloading"
        }


async def test_a_download_in_progress_is_re_read_without_waiting_for_the_resync(
    cluster: Any, operator_config: OperatorConfig
) -> None:
    """No pod event marks a download's bytes: the sync loop comes back by itself meanwhile."""
    import dataclasses

    from kubesim.operator import OperatorThread
    from kubesim.testing import DEPLOYMENTS, NS, condition, create, eventually, llmservice, obj

    reader = CountingReader()
    config = dataclasses.replace(operator_config, resync_seconds=600.0)
    async with OperatorThread(config, memo={"download_progress": reader}):
        await create(cluster, llmservice(model=MODEL))
        template = await eventually(lambda: obj(cluster, DEPLOYMENTS, "chat")["spec"]["template"])
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "chat-abc", "namespace": NS, **template["metadata"]},
            "spec": template["spec"],
            "status": {
                "podIP": "10.0.0.9",
                "initContainerStatuses": [{"name": "model-download", **RUNNING}],
            },
        }
        await create(cluster, body)
        got = await eventually(
            lambda: (
                "(30%)" in condition(cluster, "chat", "ModelReady")["message"]
                and condition(cluster, "chat", "ModelReady")
            ),
            timeout=60,
        )
    assert got["reason"] == "Downloading"
    assert got["message"] == "hf://acme/tiny: 3.0 GiB of 10.0 GiB (30%) on 1 pod"
