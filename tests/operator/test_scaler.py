"""The scaler over recorded traces: for each tick, what the pods said, and the replicas expected.

A trace is a table, one row per metrics tick (5 s apart unless said
otherwise): the queue depth each ready pod reported (None: its /metrics did
not answer), how many pods were still starting, and the replica count the
scaler must decide. The count decided at one tick is the count the next tick
observes, as in the operator's loop.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import pytest
from pagoda.operator.model import AutoscalingSpec
from pagoda.operator.scaler import (
    Decision,
    Observation,
    PodSample,
    Policy,
    State,
    decide,
    demand,
)

# targetQueueDepth 4, the KPA windows (60 s stable, 6 s panic), no scale-up
# stabilization, and a 30 s scale-down window to keep the traces short.
POLICY = Policy(
    min_replicas=1,
    max_replicas=10,
    target_queue_depth=4,
    stable_window=60,
    panic_window=6,
    scale_down_stabilization=30,
)
X = None  # a ready pod whose /metrics did not answer


@dataclass(frozen=True)
class Tick:
    queues: tuple[float | None, ...]  # one per ready pod
    expected: int
    starting: int = 0
    running: tuple[float, ...] = ()


def T(*queues: float | None, expect: int, starting: int = 0) -> Tick:
    return Tick(tuple(queues), expect, starting)


def decide_all(policy: Policy, replicas: int, steps, every: float = 5.0, check: bool = True):
    """steps: (samples, ready, starting, expected) per tick. Decide each tick
    in order, carrying state and replicas; with `check`, fail at the first
    tick whose count differs from `expected`."""
    state, decisions = State(), []
    for index, (samples, ready, starting, expected) in enumerate(steps):
        obs = Observation(
            time=index * every, replicas=replicas, ready=ready, starting=starting, samples=samples
        )
        decision = decide(policy, state, obs)
        if check:
            assert decision.replicas == expected, (
                f"tick {index} (t={index * every:.0f}s): expected {expected}, decided "
                f"{decision.replicas} ({decision.reason}: {decision.message})"
            )
        state, replicas = decision.state, decision.replicas
        decisions.append(decision)
    return decisions


def replay(
    ticks: list[Tick], policy: Policy = POLICY, replicas: int = 1, every: float = 5.0
) -> list[Decision]:
    """Run the ticks in order; fail at the first tick whose count differs from the table."""
    steps = (
        (
            tuple(
                PodSample(queue=q, running=tick.running[i] if i < len(tick.running) else 0.0)
                for i, q in enumerate(tick.queues)
                if q is not None
            ),
            len(tick.queues),
            tick.starting,
            tick.expected,
        )
        for tick in ticks
    )
    return decide_all(policy, replicas, steps, every)


def spread(total: float, ready: int, expect: int, starting: int = 0) -> Tick:
    """A total queue shared evenly by the ready pods (a Service's round robin)."""
    return Tick(tuple([total / ready] * ready), expect, starting)


def test_a_ramp_up_adds_replicas_as_the_average_demand_grows() -> None:
    # The total queue grows by 1.5 per tick from two replicas' worth; ordered
    # pods are ready a tick later. No panic: the 20 s average follows the ramp,
    # one step per stable window once it has seen the last pods serve.
    ramp = replace(POLICY, stable_window=20)
    decisions = replay(
        [
            spread(8.0, 2, expect=2),  # 2 replicas' worth: at target
            spread(9.5, 2, expect=2),  # average 2.19: within the 10% tolerance
            spread(11.0, 2, expect=3),  # average 2.38: over it
            spread(12.5, 2, starting=1, expect=3),
            spread(14.0, 3, expect=3),
            spread(15.5, 3, expect=3),  # 3.31, but the average predates the third pod
            spread(17.0, 3, expect=3),
            spread(18.5, 3, expect=3),
            spread(20.0, 3, expect=5),  # 4.44, measured with three pods serving
            spread(21.5, 3, starting=2, expect=5),
            spread(23.0, 5, expect=5),
            spread(24.5, 5, expect=5),
            spread(26.0, 5, expect=5),
            spread(27.5, 5, expect=5),
            spread(29.0, 5, expect=7),
        ],
        policy=ramp,
        replicas=2,
    )
    assert not any(d.panic for d in decisions)
    assert [d.replicas for d in decisions if d.reason == "AboveTarget"] == [3, 5, 7]


def test_a_spike_panics_to_the_needed_replicas_in_one_tick() -> None:
    # 40 requests arrive at once: 10 replicas' worth against 1. The 60 s
    # average asks for 3.3; the 6 s window for 5 at once, then 10.
    decisions = replay(
        [
            T(0, expect=1),
            T(0, expect=1),
            T(40, expect=5),  # panic; one decision adds at most max(4 pods, 100%)
            T(40, starting=4, expect=10),  # still panicking: +5 allowed from 5
            T(36, starting=9, expect=10),
        ]
    )
    assert [d.reason for d in decisions[2:]] == ["Panic", "Panic", "Panic"]
    assert decisions[2].demand is not None and decisions[2].demand < 4  # not the stable view


def test_a_spike_scales_to_its_need_at_once_without_step_limits() -> None:
    # A panic window of one tick: the spike alone is the short-window demand.
    generous = replace(POLICY, scale_up_max_step_pods=100, panic_window=5)
    decisions = replay([T(0, expect=1), T(40, expect=10)], policy=generous)
    assert decisions[1].panic and decisions[1].reason == "Panic"


def test_panic_mode_removes_nothing_for_a_stable_window() -> None:
    generous = replace(
        POLICY, scale_up_max_step_pods=100, scale_down_stabilization=0, panic_window=5
    )
    ticks = [T(0, expect=1), T(40, expect=10)]
    # The burst is served in one tick; panic still holds the ten replicas...
    ticks += [T(*[0] * 10, expect=10) for _ in range(11)]  # t = 10 ... 60 s
    # ...until a stable window (60 s) has passed since the last panicking tick.
    ticks += [T(*[0] * 10, expect=1)]
    decisions = replay(ticks, policy=generous)
    assert all(d.panic for d in decisions[1:-1]) and not decisions[-1].panic


def test_a_slow_decay_scales_down_only_after_the_window() -> None:
    # Demand falls from 3 replicas' worth to none, one step per tick; the
    # 10 s stable average follows it, and each scale-down waits until the
    # 30 s window's highest recommendation has fallen.
    policy = replace(POLICY, stable_window=10, panic_window=5)
    ticks = [T(4, 4, 4, expect=3)]
    ticks += [T(q, q, q, expect=3) for q in (3, 2, 1, 0, 0, 0)]  # t = 5 ... 30 s
    ticks += [T(0, 0, 0, expect=2)]  # t = 35 s: the last 30 s asked for 2 at most
    ticks += [T(0, 0, expect=2)]  # t = 40 s: recommended 2 at t = 15 s
    ticks += [T(0, 0, expect=1), T(0, expect=1)]  # t = 45 s: 1 at most
    decisions = replay(ticks, policy=policy, replicas=3)
    assert [d.reason for d in decisions[7:10]] == ["BelowTarget", "ScaleDownWindow", "BelowTarget"]
    assert decisions[-1].reason == "AtMinReplicas"


def test_a_short_dip_removes_nothing() -> None:
    # Two replicas at target; 20 s without a queue; back to target.
    ticks = [T(4, 4, expect=2)] * 8 + [T(0, 0, expect=2)] * 4 + [T(4, 4, expect=2)] * 8
    decisions = replay(ticks, replicas=2)
    assert "BelowTarget" not in {d.reason for d in decisions}


def test_flapping_input_around_the_target_does_not_flap_the_replicas() -> None:
    # Per-pod queues swinging around the target of 4 (2 to 6 each), after a
    # minute at target: the 60 s average stays within the 10% tolerance.
    swings = [5, 3, 6, 2, 5, 4, 3, 5, 6, 3, 4, 5, 2, 6, 4, 4, 3, 5]
    ticks = [T(4, 4, 4, 4, expect=4) for q in [4] * 12 + swings]
    decisions = replay(ticks, replicas=4)
    assert {d.reason for d in decisions} == {"WithinTolerance"}


def test_flapping_input_moves_a_short_window_scaler_once_not_back_and_forth() -> None:
    # The same swings with a 10 s stable window: the average crosses the
    # tolerance, one replica is added, and the scale-down window keeps it.
    # The same total queue (4 x the per-pod swing) spread over five pods.
    swings = [5, 3, 6, 2, 5, 4, 3, 5, 6, 3, 4, 5, 2, 6, 4, 4, 3, 5]
    ticks = [T(4, 4, 4, 4, expect=4)] * 2 + [T(5, 5, 5, 5, expect=5)]
    ticks += [T(*[4 * q / 5] * 5, expect=5) for q in swings[1:]]
    decisions = replay(ticks, policy=replace(POLICY, stable_window=10), replicas=4)
    changes = [d.replicas for a, d in itertools.pairwise(decisions) if a.replicas != d.replicas]
    assert changes == [5]


def test_unanswered_pods_are_skipped_not_counted_as_idle() -> None:
    # Two replicas at target; one pod's /metrics stops answering. Counted as 0,
    # demand would halve and the window would remove a replica. Skipped, the
    # silent pod counts as fully used for scale-down, and nothing moves.
    ticks = [T(4, 4, expect=2)] * 3 + [T(4, X, expect=2)] * 30
    decisions = replay(ticks, replicas=2)
    assert decisions[-1].state.points[-1].down == 2.0  # one measured + one silent
    # The same pod reporting an empty queue is a different story: the 60 s
    # average reaches one replica at t=70 s, the 30 s window lets one go at t=95 s.
    zeros = [T(4, 4, expect=2)] * 3 + [T(4, 0, expect=2)] * 16 + [T(4, 0, expect=1)]
    replay(zeros, replicas=2)


def test_fewer_than_half_answering_holds() -> None:
    # Three of four pods silent: whatever the one says, nothing is removed.
    ticks = [T(0, X, X, X, expect=4)] * 12
    decisions = replay(ticks, replicas=4)
    assert decisions[-1].reason == "FewPodsAnswered"
    # Two of four answering is not fewer than half: the silent two count as
    # full replicas, the idle two may go.
    # (The scale-down window needs 30 s of history: t=0 to t=30 s.)
    half = replay([T(0, 0, X, X, expect=4)] * 6 + [T(0, 0, X, X, expect=2)], replicas=4)
    assert half[-1].reason == "BelowTarget"


def test_unanswered_pods_cannot_ask_for_more() -> None:
    # One pod busy, one silent: the silent one adds no demand to scale up on.
    replay([T(6, X, expect=2)] * 6, replicas=2)


def test_pods_not_ready_are_missing_data_not_idle_capacity() -> None:
    # Two replicas at target; one pod drops out of readiness (a probe timing
    # out on a starved node) and is neither measured nor ready. Counted as
    # nothing, demand would halve and a replica would go; counted as a full
    # replica for scale-down, nothing moves.
    ticks = [T(4, 4, expect=2)] * 3 + [T(4, starting=1, expect=2)] * 30
    decisions = replay(ticks, replicas=2)
    assert "BelowTarget" not in {d.reason for d in decisions}
    # It still asks for nothing more: no scale-up either.
    assert {d.replicas for d in decisions} == {2}


def test_no_ready_pod_holds() -> None:
    # Every pod restarting: no data, no change (in either direction).
    decisions = replay([T(starting=3, expect=3)] * 10, replicas=3)
    assert decisions[-1].reason == "NoReadyPods" and not decisions[-1].measured


def test_pods_starting_are_capacity_coming_not_a_reason_to_scale_again() -> None:
    # A burst orders 4 pods; while they load (6 ticks) the queue keeps growing
    # on the one ready pod, but stays under twice the ordered capacity:
    # no second scale-up. When they are ready the queue drains.
    policy = replace(POLICY, stable_window=10, panic_window=5)
    ticks = [T(0, expect=1), T(18, expect=5)]  # 4.5 replicas' worth: a panic, +4
    ticks += [T(q, starting=4, expect=5) for q in (20, 22, 24, 26, 28, 30)]
    # Ready: the first pod still holds its backlog (a Service does not move
    # queued requests), the new ones take the new arrivals. The average is
    # still inflated by the wait, so only a panic could add more until a
    # stable window has seen the five pods serve.
    ticks += [T(24, 1, 1, 1, 1, expect=5), T(16, 1, 1, 1, 1, expect=5)]
    ticks += [T(8, 1, 1, 1, 1, expect=5), T(2, 1, 1, 1, 1, expect=5)]
    decisions = replay(ticks, policy=policy)
    assert [d.replicas for d in decisions] == [1] + [5] * 11
    assert [d.reason for d in decisions[1:4]] == ["Panic", "Panic", "WithinTolerance"]
    assert {d.reason for d in decisions[4:10]} == {"CapacityComing"}
    # Without the starting pods counted, the growing queue would have ordered more.
    alone = decide(policy, decisions[5].state, Observation(35, 5, 1, 0, (PodSample(26),)))
    assert alone.replicas > 5


def test_a_panic_still_scales_while_pods_are_starting() -> None:
    # The queue explodes past twice the ordered capacity while pods load: more.
    policy = replace(POLICY, scale_up_max_step_pods=10, panic_window=5, max_replicas=20)
    ticks = [T(0, expect=1), T(18, expect=5), T(60, starting=4, expect=15)]
    decisions = replay(ticks, policy=policy)
    assert decisions[-1].reason == "Panic"


def test_bounds_hold_whatever_the_demand() -> None:
    bounded = replace(POLICY, min_replicas=2, max_replicas=3, scale_down_stabilization=0)
    decisions = replay(
        [T(0, expect=2), T(100, starting=1, expect=3), T(100, 100, 100, expect=3)]
        + [T(0, 0, 0, expect=3)] * 12  # panic mode: a stable window (60 s)
        + [T(0, 0, 0, expect=2), T(0, 0, expect=2)],
        policy=bounded,
    )
    assert decisions[0].reason == "BelowMinReplicas"  # started at 1, below the minimum
    assert decisions[1].reason == "Panic"  # 25 replicas' worth, capped at 3
    assert decisions[2].reason == "AtMaxReplicas"
    assert decisions[-1].reason == "AtMinReplicas"
    # A count above the maximum (the bounds were lowered) comes down at once.
    (lowered,) = replay([T(4, 4, 4, 4, 4, expect=3)], policy=bounded, replicas=5)
    assert lowered.reason == "AboveMaxReplicas"


def test_min_replicas_zero_scales_to_zero_when_idle_and_stays_there() -> None:
    to_zero = replace(POLICY, min_replicas=0)
    ticks = [T(0, expect=1, starting=0)] * 6  # 25 s: within the 30 s window
    ticks += [T(0, expect=0)]  # 30 s idle: gone
    ticks += [T(expect=0)] * 3  # nothing to measure; stays at zero
    decisions = replay(ticks, policy=to_zero)
    assert decisions[6].reason == "BelowTarget"
    assert decisions[-1].reason == "ScaledToZero"


def test_min_replicas_zero_never_drops_a_running_request() -> None:
    to_zero = replace(POLICY, min_replicas=0)
    ticks = [Tick((0,), 1, running=(1,))] * 12
    replay(ticks, policy=to_zero)


def test_someone_elses_scale_stands_for_a_full_window() -> None:
    # The scaler decided 1; a user scales to 3 at t=10 s. Nothing is removed
    # until the scale-down window (30 s) has passed since.
    state = replay([T(0, expect=1)] * 3)[-1].state
    out = []
    for i in range(10):
        obs = Observation(time=15 + i * 5, replicas=3, ready=3, samples=(PodSample(0),) * 3)
        d = decide(POLICY, state, obs)
        state = d.state
        out.append(d.replicas)
        if d.replicas != 3:
            break
    assert out == [3, 3, 3, 3, 3, 3, 1]


def test_secondary_signals_take_the_largest_ask() -> None:
    policy = replace(POLICY, target_running_requests=8, target_kv_cache_usage=0.5)
    samples = [PodSample(queue=2, running=12, kv_cache_usage=0.9)] * 2
    # queue 4/4 = 1, running 24/8 = 3, kv 1.8/0.5 = 3.6 replicas.
    assert demand(policy, samples) == pytest.approx(3.6)
    # Three replicas with 12 running requests on two: the queue alone (1
    # replica's worth) would let them go; the running requests keep them.
    running_only = replace(policy, target_kv_cache_usage=None)
    ticks = [Tick((2, 2, 0), 3, running=(12, 12, 0))] * 12
    decisions = replay(ticks, policy=running_only, replicas=3)
    assert decisions[-1].reason == "WithinTolerance" and decisions[-1].demand == 3


def test_scale_up_stabilization_takes_the_lowest_recommendation() -> None:
    # 1.5 replicas' worth from t=5 s; the 10 s window still holds t=5's... and
    # t=0's recommendation (none) until t=10 s.
    slow = replace(POLICY, scale_up_stabilization=10, stable_window=5, panic_window=5)
    decisions = replay([T(0, expect=1), T(6, expect=1), T(6, expect=2)], policy=slow)
    fast = replay([T(0, expect=1), T(6, expect=2)], policy=replace(slow, scale_up_stabilization=0))
    assert decisions[1].reason == fast[1].reason == "AboveTarget"


def test_policy_comes_from_the_spec() -> None:
    spec = AutoscalingSpec.model_validate(
        {"maxReplicas": 8, "targetQueueDepth": 3, "scaleDown": {"stabilizationSeconds": 60}}
    )
    policy = Policy.from_spec(spec)
    assert (policy.min_replicas, policy.max_replicas, policy.target_queue_depth) == (1, 8, 3.0)
    assert policy.scale_down_stabilization == 60 and policy.stable_window == 60
    assert policy.scale_up_max_step_pods == 4 and policy.scale_up_max_step_percent == 100


# Arrivals: each pod tells the requests it received per second since it was
# last read, and how many finished and their time in the batch (12 s each here).
ARRIVALS = replace(POLICY, target_queue_depth=1, target_running_requests=3, max_replicas=16)
SERVICE = 12.0


@dataclass(frozen=True)
class Rated:
    queues: tuple[float, ...]  # one per ready pod
    rate: float | None  # requests per second into all of them (None: no pod knows its rate)
    expected: int
    starting: int = 0
    running: float = 3.0  # per pod
    unknown: tuple[int, ...] = ()  # pods whose rate is not known (first reading, a reset)
    refused: float = 0.0  # per pod, turned away as overloaded


def R(
    *queues: float,
    rate: float | None,
    expect: int,
    starting: int = 0,
    running: float = 3.0,
    unknown: tuple[int, ...] = (),
    refused: float = 0.0,
) -> Rated:
    return Rated(tuple(queues), rate, expect, starting, running, unknown, refused)


def replay_rated(
    ticks: list[Rated],
    policy: Policy = ARRIVALS,
    replicas: int = 2,
    hide: bool = False,
    check: bool = True,
    service: float = SERVICE,
) -> list[Decision]:
    """`replay` with arrivals; `hide` drops them (a runtime without the counters).

    With `check`, fail at the first tick whose count differs from the table.
    """

    def samples(tick: Rated) -> tuple[PodSample, ...]:
        n = len(tick.queues)
        return tuple(
            PodSample(
                queue=q,
                running=tick.running,
                arrivals=(
                    None if hide or tick.rate is None or i in tick.unknown else tick.rate / n
                ),
                finished=None if hide else 1.0,
                busy_seconds=None if hide else service,
                refused=tick.refused,
            )
            for i, q in enumerate(tick.queues)
        )

    steps = ((samples(t), len(t.queues), t.starting, t.expected) for t in ticks)
    return decide_all(policy, replicas, steps, check=check and not hide)


def burst_with_a_stuck_backlog() -> list[Rated]:
    """Two pods at 0.5 req/s (2 replicas' worth: 0.5 x 12 s / 3); 2 req/s from t=60 s."""
    ticks = [R(0, 0, rate=0.5, expect=2)] * 12
    # The burst: the two pods queue 3.5 requests a tick between them while the
    # pods ordered start (35 s). 2 req/s x 12 s / 3 = 8 replicas.
    ticks += [R(3.5, 3.5, rate=2, running=4, expect=6)]  # a panic in one tick (+4 at most)
    ticks += [R(7, 7, rate=2, running=4, starting=4, expect=6)]  # under 2 x 6: capacity coming
    ticks += [R(q, q, rate=2, running=4, starting=6, expect=8) for q in (10.5, 14, 17.5, 21, 24.5)]
    # Ready: the backlog stays in the first two pods, the new ones take new
    # arrivals (their first reading: no rate yet), and the backlog drains.
    ticks += [R(24, 24, 0, 0, 0, 0, 0, 0, rate=2, running=4, unknown=(2, 3, 4, 5, 6, 7), expect=8)]
    ticks += [R(q, q, 0, 0, 0, 0, 0, 0, rate=2, running=3, expect=8) for q in range(23, 3, -1)]
    return ticks


def test_a_backlog_stuck_in_the_first_pods_does_not_order_more_than_the_arrivals_need() -> None:
    ticks = burst_with_a_stuck_backlog()
    decisions = replay_rated(ticks)
    assert decisions[12].reason == "Panic" and max(d.replicas for d in decisions) == 8
    assert "arrivals justify 8.0" in decisions[14].message
    assert decisions[-1].arrival_rate == pytest.approx(2) and decisions[-1].service_time == 12
    # The same pods without the counters: the backlog reads as demand for every
    # pod allowed, though new pods cannot take any of it.
    gauges = replay_rated(ticks, hide=True)
    assert max(d.replicas for d in gauges) == 16


def test_a_pods_first_reading_or_reset_counter_holds_the_count() -> None:
    # Four pods at 0.5 req/s each, their batches full (2 req/s x 8 s = 16
    # running), nothing waiting; no targetRunningRequests, so the running
    # count is no signal: the arrivals over a full batch of 4 hold four replicas.
    policy = replace(POLICY, max_num_seqs=4)
    steady = [R(0, 0, 0, 0, rate=2, running=4, expect=4)] * 8
    # A pod restarts (its counter went back: no rate), then another pod is
    # read for the first time: no total is known for those ticks, and the
    # rate of the window's other ticks stands.
    blind = [R(0, 0, 0, 0, rate=2, running=4, unknown=(0,), expect=4)] * 3
    blind += [R(0, 0, 0, 0, rate=2, running=4, unknown=(3,), expect=4)] * 3
    ticks = steady + blind + steady
    decisions = replay_rated(ticks, policy=policy, replicas=4, service=8.0)
    assert {d.replicas for d in decisions} == {4}
    assert decisions[10].arrival_rate == pytest.approx(2)
    # The same pods read as gauges only: the queue alone lets three go.
    gauges = replay_rated(ticks, policy=policy, replicas=4, hide=True)
    assert gauges[-1].replicas == 1


def test_no_rate_at_all_is_the_queue_rule_unchanged() -> None:
    # Every pod read for the first time (or a runtime without the counters):
    # the decision is what the gauges alone give.
    first = replay_rated([R(40, rate=None, running=4, expect=5)], replicas=1)[0]
    gauges = replay([Tick((40,), 5, running=(4,))], policy=ARRIVALS)[0]
    assert (first.replicas, first.reason) == (gauges.replicas, gauges.reason)
    assert first.arrival_rate is None


def test_a_queue_that_keeps_growing_is_demand_whatever_the_arrivals_say() -> None:
    # The arrivals say two replicas suffice, but once nothing is starting the
    # queue keeps growing: the pods serve less than the arrivals assume (a
    # batch that cannot reach its target). The queue takes over.
    ticks = [R(0, 0, rate=0.5, expect=2)] * 12
    ticks += [R(2, 2, rate=0.5, running=4, expect=2), R(4, 4, rate=0.5, running=4, expect=6)]
    decisions = replay_rated(ticks)
    assert decisions[-1].reason == "Panic"


def test_a_backlog_that_does_not_drain_once_the_new_pods_serve_is_demand_after_all() -> None:
    # The same burst, but the backlog stays where it is after the new pods are
    # ready (clients that send again only when answered: their rate is what
    # the pods serve, not what they want). A stable window after the pods
    # became ready (t=155 s), the queue is no longer bounded by the arrivals.
    ticks = burst_with_a_stuck_backlog()[:20]
    ticks += [R(24, 24, 0, 0, 0, 0, 0, 0, rate=2, running=4, expect=8)] * 11
    ticks += [R(24, 24, 0, 0, 0, 0, 0, 0, rate=2, running=4, expect=16)]
    decisions = replay_rated(ticks)
    assert decisions[-1].reason == "Panic" and "arrivals justify" not in decisions[-1].message


def test_requests_turned_away_leave_the_queue_unbounded_by_the_arrivals() -> None:
    # The same burst, but from t=75 s the first pods' queues are full and they
    # refuse requests: the received count misses those, so the arrivals bound
    # nothing and the queue's panic goes on as without them.
    ticks = burst_with_a_stuck_backlog()[:19]
    ticks[15:] = [replace(t, refused=2.0) for t in ticks[15:]]
    decisions = replay_rated(ticks, check=False)
    assert [d.replicas for d in decisions[12:]] == [6, 6, 8, 16, 16, 16, 16]
    assert "arrivals justify" not in decisions[15].message


def test_the_arrivals_need_a_batch_to_fill() -> None:
    # targetRunningRequests is the batch per replica the arrivals are sized
    # for; without it, a full engine.maxNumSeqs; without either, no arrival
    # signal at all (the runtime's own default batch may not fit the KV cache).
    assert replace(POLICY, target_running_requests=3, max_num_seqs=8).batch_target == 3
    assert replace(POLICY, max_num_seqs=8).batch_target == 8
    assert POLICY.batch_target is None
    ticks = [R(0, 0, rate=2, running=4, expect=2)] * 3
    decisions = replay_rated(ticks, policy=POLICY, check=False)
    assert decisions[-1].arrival_rate == pytest.approx(2)  # measured...
    assert decisions[-1].demand == 0  # ...but asks for nothing
    sized = replay_rated(ticks, policy=replace(POLICY, max_num_seqs=4), check=False)
    assert sized[-1].demand == pytest.approx(2 * SERVICE / 4)
    spec = AutoscalingSpec.model_validate({"maxReplicas": 8})
    assert Policy.from_spec(spec, 16).max_num_seqs == 16
