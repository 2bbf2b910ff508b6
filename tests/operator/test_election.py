"""Leader election against the simulated API server: the Lease as the candidates write it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubesim.apiserver import ApiServer
from kubesim.testing import NS, eventually
from pagoda.operator import metrics
from pagoda.operator.api import KubeApi
from pagoda.operator.election import LeaderElector, Lease, identity
from pagoda.operator.leader import Timing

LEASE = Lease(NS, "pagoda-operator")
LEASES = "coordination.k8s.io/v1/leases"
# Short, for the tests that run the renewal loop on the real clock.
FAST = Timing(lease_duration=1.0, renew_deadline=0.5, retry_period=0.1)


class Clock:
    """A candidate's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
async def api(cluster: ApiServer) -> AsyncIterator[KubeApi]:
    client = KubeApi.from_environment()
    yield client
    client.close()


def lease_spec(server: ApiServer) -> dict[str, Any]:
    stored = server.get_object(LEASES, NS, LEASE.name)
    assert stored is not None
    return stored["spec"]


def leader_gauge() -> float:
    return metrics.REGISTRY.get_sample_value(
        "pagoda_operator_leader", {"lease": f"{NS}/{LEASE.name}"}
    )


async def test_the_first_candidate_creates_the_lease_and_leads(
    cluster: ApiServer, api: KubeApi
) -> None:
    elector = LeaderElector(api, LEASE, "a_1")
    assert await elector.acquire(asyncio.Event())
    spec = lease_spec(cluster)
    assert spec["holderIdentity"] == "a_1" and spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0 and spec["acquireTime"] == spec["renewTime"]
    assert elector.leading and leader_gauge() == 1


async def test_a_standby_takes_over_only_after_the_lease_expired_on_its_clock(
    cluster: ApiServer, api: KubeApi
) -> None:
    leader = LeaderElector(api, LEASE, "a_1")
    clock = Clock()
    standby = LeaderElector(api, LEASE, "b_1", clock=clock)
    assert await leader.try_acquire_or_renew()
    assert not await standby.try_acquire_or_renew()
    clock.now += 14.9
    assert not await standby.try_acquire_or_renew()
    assert lease_spec(cluster)["holderIdentity"] == "a_1"
    clock.now += 0.1
    assert await standby.try_acquire_or_renew()
    spec = lease_spec(cluster)
    assert spec["holderIdentity"] == "b_1" and spec["leaseTransitions"] == 1
    # The old leader's next renewal finds it taken: it no longer leads.
    assert not await leader.try_acquire_or_renew() and not leader.leading


async def test_a_renewal_restarts_the_standbys_clock(cluster: ApiServer, api: KubeApi) -> None:
    leader = LeaderElector(api, LEASE, "a_1")
    clock = Clock()
    standby = LeaderElector(api, LEASE, "b_1", clock=clock)
    assert await leader.try_acquire_or_renew()
    assert not await standby.try_acquire_or_renew()
    clock.now += 10
    await asyncio.sleep(0.01)  # a renewTime that differs from the one written before
    assert await leader.try_acquire_or_renew()
    assert not await standby.try_acquire_or_renew()  # saw the renewal at +10
    clock.now += 10  # +20 since the first read, only +10 since the renewal
    assert not await standby.try_acquire_or_renew()
    assert lease_spec(cluster)["holderIdentity"] == "a_1"


class ReadTogether:
    """The API, except that the candidates' reads all return before any of them writes."""

    def __init__(self, api: KubeApi, parties: int) -> None:
        self._api = api
        self._barrier = asyncio.Barrier(parties)

    async def get(self, *args: Any) -> Any:
        found = await self._api.get(*args)
        await self._barrier.wait()
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


@pytest.mark.parametrize("lease_exists", [False, True], ids=["create", "takeover"])
async def test_of_two_candidates_that_read_the_same_lease_only_one_wins(
    cluster: ApiServer, api: KubeApi, lease_exists: bool
) -> None:
    if lease_exists:
        gone = LeaderElector(api, LEASE, "old_1")
        assert await gone.try_acquire_or_renew()
        await gone.release()
    racing = ReadTogether(api, 2)
    candidates = [LeaderElector(racing, LEASE, name) for name in ("a_1", "b_1")]  # type: ignore[arg-type]
    won = await asyncio.gather(*(c.try_acquire_or_renew() for c in candidates))
    assert sorted(won) == [False, True]
    winner = candidates[won.index(True)]
    assert lease_spec(cluster)["holderIdentity"] == winner.identity


async def test_a_released_lease_is_taken_over_at_once(cluster: ApiServer, api: KubeApi) -> None:
    leader = LeaderElector(api, LEASE, "a_1")
    standby = LeaderElector(api, LEASE, "b_1", clock=Clock())  # its clock never moves
    assert await leader.try_acquire_or_renew()
    assert not await standby.try_acquire_or_renew()
    await leader.release()
    spec = lease_spec(cluster)
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    assert not leader.leading and leader_gauge() == 0
    assert await standby.try_acquire_or_renew()
    assert lease_spec(cluster)["leaseTransitions"] == 1


async def test_keep_renews_until_stopped(cluster: ApiServer, api: KubeApi) -> None:
    leader = LeaderElector(api, LEASE, "a_1", FAST)
    stopping = asyncio.Event()
    assert await leader.acquire(stopping)
    first = lease_spec(cluster)["renewTime"]
    keeping = asyncio.create_task(leader.keep(stopping))
    await eventually(lambda: lease_spec(cluster)["renewTime"] != first)
    stopping.set()
    assert await keeping is False  # stopped, not lost
    assert leader.leading


async def test_keep_gives_up_when_renewals_fail_past_the_deadline(
    cluster: ApiServer, api: KubeApi
) -> None:
    leader = LeaderElector(api, LEASE, "a_1", FAST)
    assert await leader.acquire(asyncio.Event())
    cluster.fail("PUT", "/leases/", 503)
    assert await leader.keep(asyncio.Event()) is True  # lost
    assert leader_gauge() == 0


async def test_keep_gives_up_at_once_when_another_holder_took_the_lease(
    cluster: ApiServer, api: KubeApi
) -> None:
    leader = LeaderElector(api, LEASE, "a_1", Timing(lease_duration=60, renew_deadline=50))
    assert await leader.acquire(asyncio.Event())
    clock = Clock()
    thief = LeaderElector(api, LEASE, "b_1", clock=clock)
    assert not await thief.try_acquire_or_renew()
    clock.now += 60
    assert await thief.try_acquire_or_renew()
    # Not after the 50 s renew deadline: the first renewal round sees the new holder.
    assert await asyncio.wait_for(leader.keep(asyncio.Event()), timeout=30) is True


def test_identity_is_the_pod_name_with_a_random_suffix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "pagoda-operator-7d9c-x2x4q")
    first, second = identity(), identity()
    assert first.startswith("pagoda-operator-7d9c-x2x4q_") and first != second
