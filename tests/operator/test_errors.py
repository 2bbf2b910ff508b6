"""API errors: permanent ones become a condition and stop, transient ones are retried."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
from kubesim.apiserver import ApiServer
from kubesim.testing import (
    DEPLOYMENTS,
    LLMS,
    NS,
    condition,
    create,
    events,
    eventually,
    llmservice,
    obj,
    patch,
    path_of,
    requests_to,
)
from pagoda.operator.config import OperatorConfig
from pagoda.operator.errors import Backoff, condition_reason, is_permanent

AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
INVALID = "spec.template.spec.affinity.nodeAffinity: Required value: must have at least one term"


@pytest.mark.parametrize(
    ("status", "permanent"),
    [(400, True), (403, True), (404, True), (422, True), (409, False), (429, False),
     (500, False), (503, False), (None, False)],
)  # fmt: skip
def test_four_hundreds_are_permanent_except_conflicts_and_throttling(
    status: int | None, permanent: bool
) -> None:
    assert is_permanent(status) is permanent


def test_permanent_errors_have_a_reason_a_user_can_act_on() -> None:
    assert condition_reason(422) == "InvalidSpec"
    assert condition_reason(403) == "Forbidden"
    assert condition_reason(404) == "ApiRejected"


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(first=1.0, cap=5.0, random=lambda: 0.0)
    assert [backoff.next() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.next() == 1.0


def test_backoff_is_jittered_within_its_lower_half() -> None:
    shortest = Backoff(first=1.0, cap=5.0, random=lambda: 1.0)
    assert [shortest.next() for _ in range(4)] == [0.5, 1.0, 2.0, 2.5]
    # Loops that failed together retry apart.
    delays = {Backoff(first=8.0).next() for _ in range(20)}
    assert len(delays) > 1 and all(4.0 <= d <= 8.0 for d in delays)


def quiet(config: OperatorConfig) -> OperatorConfig:
    return dataclasses.replace(config, resync_seconds=3600.0)


async def test_a_refused_write_becomes_a_condition_and_is_not_retried_hot(
    cluster: ApiServer, run_operator: Any, operator_config: OperatorConfig
) -> None:
    cluster.fail("PATCH", "/deployments/chat$", 422, reason="Invalid", message=INVALID)
    async with run_operator(quiet(operator_config)):
        await create(cluster, llmservice(scheduling={"affinity": AFFINITY}))
        degraded = await eventually(
            lambda: (
                condition(cluster, "chat", "Degraded")["status"] == "True"
                and condition(cluster, "chat", "Degraded")
            )
        )
        assert degraded["reason"] == "InvalidSpec"
        assert INVALID in degraded["message"] and f"Deployment {NS}/chat" in degraded["message"]
        assert condition(cluster, "chat", "Ready")["status"] == "False"
        await asyncio.sleep(1.0)
        attempts = len(requests_to(cluster, "PATCH", "/deployments/chat"))
        await asyncio.sleep(2.0)
        assert len(requests_to(cluster, "PATCH", "/deployments/chat")) == attempts <= 3
        (event,) = events(cluster, "InvalidSpec")
        assert event["type"] == "Warning" and INVALID in event["message"]
        # Fixing the spec is what brings it back.
        cluster.clear_failures()
        await patch(
            cluster, path_of(LLMS, NS, "chat"), {"spec": {"scheduling": {"affinity": None}}}
        )
        await eventually(lambda: obj(cluster, DEPLOYMENTS, "chat"))
        await eventually(lambda: condition(cluster, "chat", "Degraded")["status"] == "False")


async def test_transient_errors_are_retried_with_backoff(
    cluster: ApiServer, run_operator: Any, operator_config: OperatorConfig
) -> None:
    cluster.fail("PATCH", "/deployments/chat$", 503, reason="ServiceUnavailable", times=2)
    async with run_operator(quiet(operator_config)):
        started = time.monotonic()
        await create(cluster, llmservice())
        await eventually(lambda: obj(cluster, DEPLOYMENTS, "chat"), timeout=15)
        # Retried after 1 s, then 2 s (each jittered down to half at most):
        # neither hot nor waiting for the resync.
        assert 1.5 <= time.monotonic() - started < 10.0
        await eventually(lambda: condition(cluster, "chat", "Degraded"))
        assert condition(cluster, "chat", "Degraded")["status"] == "False"
    assert len(requests_to(cluster, "PATCH", "/deployments/chat")) >= 3
