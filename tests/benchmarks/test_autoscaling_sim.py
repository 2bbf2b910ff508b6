"""The autoscaling simulator: its queueing model, and that it drives the operator's own scaler."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import autoscaling_sim as sim
from pagoda.operator import scaler

SERVICE = sim.Service(slots=4, ttft=0.5, tpot=0.05, output_len=31, pod_start=20)  # 2 s each


def test_the_simulator_runs_the_operators_scaler_not_a_copy() -> None:
    assert sim.decide is scaler.decide
    assert sim.Policy is scaler.Policy


def test_poisson_arrivals_follow_the_rates() -> None:
    workload = sim.Workload(base=2, burst=10, burst_start=1000, burst_end=1500, duration=2000)
    arrivals = workload.arrivals()
    base = sum(1 for t in arrivals if t < 1000) / 1000
    burst = sum(1 for t in arrivals if 1000 <= t < 1500) / 500
    assert base == pytest.approx(2, rel=0.1) and burst == pytest.approx(10, rel=0.1)


def test_fixed_replicas_cost_their_count_times_the_duration() -> None:
    workload = sim.Workload(base=1, burst=1, burst_start=0, burst_end=0, duration=300)
    trace = sim.simulate(workload, SERVICE, sim.fixed(3), 3)
    assert trace.replica_seconds == pytest.approx(900, rel=0.01)
    # 1 req/s against 6 req/s of capacity: hardly any queueing.
    assert trace.summary()["queue_p99_s"] < 1.0


def test_an_overloaded_pod_builds_a_queue() -> None:
    # 4 req/s against 2 req/s of capacity for 100 s: ~200 requests behind.
    workload = sim.Workload(base=4, burst=4, burst_start=0, burst_end=0, duration=100)
    trace = sim.simulate(workload, SERVICE, sim.fixed(1), 1)
    assert max(trace.queue) > 150 and trace.summary()["queue_p99_s"] > 30


def test_a_burst_scales_the_builtin_policy_out_and_back_in() -> None:
    workload = sim.Workload(base=1, burst=8, burst_start=300, burst_end=600, duration=1500)
    # Running requests as the second signal: with enough pods nobody waits,
    # and the queue alone would read as no demand at all.
    policy = sim.default_policy(
        16,
        4,
        targetQueueDepth=1,
        targetRunningRequests=3,
        scaleDown={"stabilizationSeconds": 120},
    )
    trace = sim.simulate(workload, SERVICE, sim.builtin(policy), 1)
    during = [r for t, r in zip(trace.times, trace.replicas, strict=True) if 330 <= t < 600]
    after = [r for t, r in zip(trace.times, trace.replicas, strict=True) if t > 1300]
    assert min(during) >= 4  # 8 req/s needs 4 pods of 2 req/s
    # The arrivals ask for 8 req/s x 2 s / 3 = 5.3 replicas; the backlog stuck
    # in the first pod while the others start does not add to that.
    assert max(during) <= 7
    assert max(after) <= 2
    # Without the counters, the backlog reads as demand for every pod allowed.
    gauges = sim.simulate(workload, SERVICE, sim.builtin(policy, counters=False), 1)
    assert max(gauges.replicas) == 16


def test_the_simulated_pods_count_arrivals_like_the_runtime() -> None:
    # A queue target no queue reaches: only the arrival rate can scale. 8
    # req/s of 2 s requests fill 4 batches of 4.
    workload = sim.Workload(base=8, burst=8, burst_start=0, burst_end=0, duration=120)
    policy = sim.default_policy(16, 4, targetQueueDepth=1000)
    trace = sim.simulate(workload, SERVICE, sim.builtin(policy), 1)
    assert max(trace.replicas) >= 4
    gauges = sim.simulate(workload, SERVICE, sim.builtin(policy, counters=False), 1)
    assert max(gauges.replicas) == 1


def test_the_threshold_rule_polls_every_30_seconds() -> None:
    rule = sim.threshold_rule(target=1, min_replicas=1, max_replicas=10)
    busy = [sim.PodView(0, waiting=20, running=4)]
    assert rule(0.0, 1, busy, 0) == 5  # wants 10; +100% or +4 pods, whichever is more
    assert rule(10.0, 5, busy, 0) == 5  # no poll before 30 s
    assert rule(30.0, 5, busy, 0) == 10  # wants 20: capped at maxReplicas
