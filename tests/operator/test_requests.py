"""What one reconcile costs the API server, counted on the simulated one.

A reconcile woken by a pod event (a rollout sends dozens) reads its children,
pods and EndpointSlices from the watch-fed cache and skips the apply of each
child that is unchanged: a status write, when the status changed, is then its
only request.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Any

from kubesim.apiserver import ApiServer
from kubesim.testing import (
    CONFIGMAPS,
    DEPLOYMENTS,
    LLMS,
    NS,
    create,
    events,
    eventually,
    llmservice,
    obj,
    patch,
    path_of,
)
from pagoda.operator import metrics
from pagoda.operator.config import OperatorConfig

CHILD_PATHS = ("/deployments", "/services", "/configmaps", "/poddisruptionbudgets", "/pods")


def _watch_passes() -> float:
    return metrics.RECONCILES.labels("watch", "ok")._value.get()


def _calls(requests: list[Any]) -> Counter[str]:
    """The operator's requests by kind: reads, lists and writes of children, status writes."""
    out: Counter[str] = Counter()
    for request in requests:
        method, path = str(request.method.value), str(request.url.path)
        params = dict(request.params)
        if "watch" in params or path.endswith("/events") or method == "POST":
            continue  # kopf's watch streams, Events, the test's own pod
        if method == "PATCH" and path.endswith("/status"):
            out["status write"] += 1
        elif method == "PATCH" and any(p in path for p in CHILD_PATHS):
            out["child apply"] += 1
        elif method == "GET" and (path.endswith("/pods") or path.endswith("/endpointslices")):
            out["list"] += 1
        elif method == "GET" and any(p in path for p in CHILD_PATHS):
            out["child read"] += 1
        else:
            out[f"other {method} {path}"] += 1
    return out


def _pod(server: ApiServer, name: str) -> dict[str, Any]:
    template = obj(server, DEPLOYMENTS, "chat")["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": template["metadata"]["labels"]},
        "status": {"phase": "Pending"},
    }


async def test_a_pod_event_costs_no_read_list_or_apply(
    cluster: ApiServer, run_operator: Any, operator_config: OperatorConfig
) -> None:
    quiet = dataclasses.replace(operator_config, resync_seconds=3600.0)
    async with run_operator(quiet):
        await create(cluster, llmservice())
        await eventually(lambda: obj(cluster, LLMS, "chat")["status"]["conditions"])
        await asyncio.sleep(0.5)  # the passes woken by the operator's own writes
        passes, start = _watch_passes(), len(list(cluster))
        await create(cluster, _pod(cluster, "chat-1"))  # the Deployment controller's pod
        await eventually(lambda: _watch_passes() > passes)
        calls = _calls(list(cluster)[start:])
    print(f"requests of a pass woken by a pod event: {dict(calls)}")
    assert calls["child read"] == 0 and calls["list"] == 0, calls
    assert calls["child apply"] == 0, calls
    assert set(calls) <= {"status write"}, calls


async def test_a_hand_edit_is_repaired_by_the_pass_its_event_wakes(
    cluster: ApiServer, run_operator: Any, operator_config: OperatorConfig
) -> None:
    quiet = dataclasses.replace(operator_config, resync_seconds=3600.0)  # no resync to help
    async with run_operator(quiet):
        await create(cluster, llmservice())
        await eventually(lambda: obj(cluster, LLMS, "chat")["status"]["conditions"])
        await asyncio.sleep(0.5)
        await create(cluster, _pod(cluster, "chat-1"))  # a pass that skips every apply
        await asyncio.sleep(0.5)
        await patch(
            cluster,
            path_of(CONFIGMAPS, NS, "chat-engine"),
            {"data": {"PAGODA_DTYPE": "float16"}},
            fieldManager="kubectl-edit",
        )
        await eventually(
            lambda: obj(cluster, CONFIGMAPS, "chat-engine")["data"]["PAGODA_DTYPE"] == "auto"
        )
        (event,) = await eventually(lambda: events(cluster, "DriftRepaired"))
        assert "data.PAGODA_DTYPE" in event["message"]
