"""Two operator replicas on one cluster: one leads through the Lease, the other stands by.

The LLMServices have no replicas, so no model pod starts: what is checked is
which replica reconciles (the Deployment of each LLMService appears) and how
the Lease moves from one replica to the other.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubesim.apiserver import ApiServer
from kubesim.cluster import Cluster
from kubesim.operator import OperatorThread
from kubesim.testing import llmservice, requests_to
from pagoda.operator.cli import LeadershipLost, Options

from .conftest import CONFIG

LEASES = "coordination.k8s.io/v1/leases"
LEASE_NAMESPACE = "pagoda-system"
ELECTED = Options(standalone=False, liveness=None, metrics_port=None)


@pytest.fixture()
async def node(kmock: ApiServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    """The cluster without an operator: each test starts its replicas."""
    async with Cluster(kmock, tmp_path) as running:
        yield running


def lease(node: Cluster) -> dict[str, Any]:
    found = node.api.get_object(LEASES, LEASE_NAMESPACE, CONFIG.lease_name)
    assert found is not None, "no Lease"
    return found["spec"]


def parse_time(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


async def reconciled(node: Cluster, name: str) -> None:
    await node.create(llmservice(name, replicas=0))
    await node.wait_for(lambda: node.get("Deployment", name), 30, f"{name}'s Deployment")


async def test_a_standby_takes_over_within_the_lease_duration_after_the_leader_crashed(
    node: Cluster,
) -> None:
    config = dataclasses.replace(
        CONFIG,
        lease_namespace=LEASE_NAMESPACE,
        lease_duration_seconds=3.0,
        renew_deadline_seconds=2.0,
        retry_period_seconds=0.5,
    )
    async with OperatorThread(config, ELECTED) as first:
        await reconciled(node, "before")
        leader = lease(node)["holderIdentity"]
        async with OperatorThread(config, ELECTED, wait_ready=False) as second:
            # The standby has read the Lease (and found it held) at least once.
            await node.wait_for(
                lambda: len(requests_to(node.api, "GET", "/leases/")) >= 3, 10, "the standby reads"
            )
            assert not second.is_ready and lease(node)["holderIdentity"] == leader
            # A crash: the leader neither renews nor releases the Lease again.
            node.api.fail("PUT", r"/leases/", 503)
            first.stop()
            await node.wait_for(lambda: not first.is_alive, 30, "the leader gone")
            last_renewal = parse_time(lease(node)["renewTime"])
            node.api.clear_failures()

            await node.wait_for(lambda: second.is_ready, 30, "the standby leading")
            taken = lease(node)
            assert taken["holderIdentity"] not in ("", leader)
            assert taken["leaseTransitions"] == 1
            # Never before the old leader's lease ran out.
            waited = parse_time(taken["acquireTime"]) - last_renewal
            assert waited >= datetime.timedelta(seconds=config.lease_duration_seconds)
            await reconciled(node, "after")
        assert second.error is None


async def test_a_leader_that_stops_hands_the_lease_to_the_standby_at_once(
    node: Cluster,
) -> None:
    # A lease this long would keep the standby waiting past the test's patience:
    # it takes over in time only because the stopping leader released the Lease.
    config = dataclasses.replace(
        CONFIG,
        lease_namespace=LEASE_NAMESPACE,
        lease_duration_seconds=120.0,
        renew_deadline_seconds=60.0,
        retry_period_seconds=0.5,
    )
    async with OperatorThread(config, ELECTED) as first:
        await reconciled(node, "before")
        async with OperatorThread(config, ELECTED, wait_ready=False) as second:
            first.stop()
            await node.wait_for(lambda: not first.is_alive, 30, "the leader gone")
            await node.wait_for(lambda: second.is_ready, 30, "the standby leading")
            assert lease(node)["leaseTransitions"] == 1
            await reconciled(node, "after")
        assert first.error is None and second.error is None


async def test_a_leader_that_cannot_renew_stops_and_exits_with_an_error(node: Cluster) -> None:
    config = dataclasses.replace(
        CONFIG,
        lease_namespace=LEASE_NAMESPACE,
        lease_duration_seconds=3.0,
        renew_deadline_seconds=2.0,
        retry_period_seconds=0.5,
    )
    async with OperatorThread(config, ELECTED) as leader:
        await reconciled(node, "before")
        node.api.fail("PUT", r"/leases/", 503)  # the API server refuses every renewal
        # Its handlers stop and the process ends, so the pod restarts as a standby.
        await node.wait_for(lambda: not leader.is_alive, 30, "the leader gone")
        assert isinstance(leader.error, LeadershipLost)
        # It stopped leading without releasing: the Lease still names it.
        assert lease(node)["holderIdentity"]
