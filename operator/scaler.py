"""How many replicas an LLMService needs: a pure function of metrics, state and policy.

`decide(policy, state, observation)` takes one tick's measurements (what each
ready pod's /metrics said, how many pods are starting, the replica count now)
and the state the previous tick left, and returns the replica count, a reason,
and the next state. No clock, no I/O: the operator's autoscaler loop calls it
every `metricsIntervalSeconds`, the simulator (`benchmarks/autoscaling/`)
calls the very same function on simulated pods, and the tests call it on
recorded traces.

The design takes the parts of Knative's KPA and Kubernetes' HPA that matter
for LLM serving, where a new replica takes tens of seconds to minutes to load:

* **Demand in replicas.** Each signal (queue depth, and optionally running
  requests and KV-cache usage) is summed over the pods and divided by its
  per-replica target; the largest signal wins (HPA's max over metrics).
* **Arrivals** (Little's law). Each pod also tells how many requests it
  received since it was last read, and how long the requests that finished
  spent in the batch. The arrival rate times that time is the batch the
  arrivals keep busy; over the batch target (targetRunningRequests, else a
  full engine.maxNumSeqs) it is the replicas they ask for, one more signal.
  It also bounds the others on the way up: a queue stays in the pod it
  reached, so a backlog that built up while pods were starting is no
  demand for more pods, which would only take new arrivals. The queue
  still starts a panic within a tick; the arrivals size it. The bound is
  off while the rate is not known for every ready pod (a first reading, a
  counter that went back, a pod that did not answer), while a pod refuses
  requests because its queue is full (those never count as received), and
  when the queue does not drain once the capacity ordered is serving (the
  arrivals then understate the demand: a batch that cannot reach its
  target, or clients that send only when answered, whose rate is the pods'
  throughput).
* **Missing data is not zero.** A ready pod whose /metrics did not answer is
  left out of the sum when deciding to scale up (it cannot ask for more), and
  counted as one fully used replica when deciding to scale down (it cannot
  give one back), as HPA treats pods without metrics. A pod that is not
  ready yet (loading, or dropped out of readiness for a while) is missing
  data too: it counts as a full replica for scale-down, so nothing is removed
  on the strength of pods that could not be measured. If fewer than half the
  ready pods answered, nothing is removed at all.
* **Stable and panic windows** (KPA). Demand is averaged over the stable
  window (60 s); over the short panic window (6 s), demand of twice the
  current replicas scales up at once and starts panic mode, in which nothing
  is removed until a stable window has passed without panic.
* **Tolerance.** Demand within 10% of the current replicas changes nothing.
* **Pods that are starting are capacity coming.** While any pod loads, only a
  panic adds more: a queue that keeps growing because the new pods are not up
  yet must not order yet more pods every tick. And until a whole stable window
  has been measured with the new pods serving, the average still holds the
  queue that built up without them (a Service does not move requests queued
  in one pod to another), so again only a panic adds more.
* **Stabilization** (HPA). A scale-down goes only to the highest
  recommendation of the scale-down window, so it happens only once the whole
  window asked for less (and never before one full window of history); a
  scale-up goes to the lowest of the (default empty) scale-up window.
* **Step limits and bounds**, applied last: minReplicas and maxReplicas always
  hold.
* **Zero.** With minReplicas 0 the count reaches zero only when no request
  waits or runs anywhere; at zero there is no pod to measure, so it stays
  there until someone writes the scale subresource.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

# Demand within this fraction of the current replicas changes nothing.
TOLERANCE = 0.10
# Short-window demand of this many times the current replicas is a panic.
PANIC_THRESHOLD = 2.0


@dataclass(frozen=True, slots=True)
class Policy:
    """The autoscaling spec, in seconds and plain numbers."""

    min_replicas: int
    max_replicas: int
    target_queue_depth: float
    target_running_requests: float | None = None
    target_kv_cache_usage: float | None = None
    stable_window: float = 60.0
    panic_window: float = 6.0
    scale_up_stabilization: float = 0.0
    scale_up_max_step_percent: float = 100.0
    scale_up_max_step_pods: int = 4
    scale_down_stabilization: float = 300.0
    scale_down_max_step_pods: int | None = None
    # engine.maxNumSeqs: the batch an arrival rate fills when no
    # targetRunningRequests says how full a replica should be.
    max_num_seqs: int | None = None

    @property
    def batch_target(self) -> float | None:
        """Requests in the batch per replica that the arrival rate is sized for."""
        return self.target_running_requests or self.max_num_seqs or None

    @classmethod
    def from_spec(cls, spec: Any, max_num_seqs: int | None = None) -> Policy:
        """From an `AutoscalingSpec` (pagoda.operator.model) and the engine's maxNumSeqs."""
        return cls(
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            target_queue_depth=float(spec.target_queue_depth),
            target_running_requests=spec.target_running_requests,
            target_kv_cache_usage=spec.target_kv_cache_usage,
            stable_window=float(spec.stable_window_seconds),
            panic_window=float(spec.panic_window_seconds),
            scale_up_stabilization=float(spec.scale_up.stabilization_seconds),
            scale_up_max_step_percent=float(spec.scale_up.max_step_percent),
            scale_up_max_step_pods=spec.scale_up.max_step_pods,
            scale_down_stabilization=float(spec.scale_down.stabilization_seconds),
            scale_down_max_step_pods=spec.scale_down.max_step_pods,
            max_num_seqs=max_num_seqs,
        )


@dataclass(frozen=True, slots=True)
class PodSample:
    """What one ready pod's /metrics said."""

    queue: float  # vllm:num_requests_waiting + pagoda:num_requests_pending
    running: float = 0.0  # vllm:num_requests_running
    kv_cache_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0-1
    # Since this pod's previous scrape (None: not known, e.g. the first
    # scrape of a pod, a counter that went back, a runtime without the series):
    arrivals: float | None = None  # requests received per second (pagoda:requests_received)
    finished: float | None = None  # requests finished (vllm:request_inference_time_seconds count)
    busy_seconds: float | None = None  # their time in the batch, summed (the histogram's sum)
    refused: float | None = None  # requests turned away as overloaded (queue full)


@dataclass(frozen=True, slots=True)
class Observation:
    """One tick's view of an LLMService."""

    time: float  # seconds, any monotonic origin
    replicas: int  # the scale subresource's value now
    ready: int  # ready pods (they get traffic)
    starting: int = 0  # pods not ready yet and not terminating
    samples: tuple[PodSample, ...] = ()  # from the ready pods that answered

    @property
    def unanswered(self) -> int:
        """Ready pods whose /metrics did not answer."""
        return max(0, self.ready - len(self.samples))


@dataclass(frozen=True, slots=True)
class Point:
    """One tick of demand history, in replicas."""

    time: float
    up: float  # unanswered pods counted as idle: what may justify adding replicas
    down: float  # unanswered pods counted as full: what may justify removing them
    queue: float = 0.0  # the queue signal alone, in replicas (part of `up`)
    other: float = 0.0  # the other signals (running, KV cache), in replicas (part of `up`)
    arrivals: float | None = None  # requests per second into all ready pods (None: not known)
    finished: float = 0.0  # requests finished, with a known time in the batch...
    busy_seconds: float = 0.0  # ...and that time, summed


@dataclass(frozen=True, slots=True)
class State:
    """What the scaler carries from one tick to the next."""

    points: tuple[Point, ...] = ()
    # (time, recommended replicas): the stabilization windows look back on these.
    recommendations: tuple[tuple[float, int], ...] = ()
    # When the current history began: a scale-down needs a full window of it.
    since: float | None = None
    # Panic mode lasts until then; it began then.
    panic_until: float | None = None
    panic_since: float | None = None
    # The count this scaler decided last: another value means someone else scaled.
    decided: int | None = None
    # Ready pods last tick, and when that number last grew.
    ready: int = 0
    grown_at: float | None = None
    # The mean time in the batch last measured: the fallback when no request
    # finished within the stable window.
    service_time: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The replica count for now, why, and the state for the next tick."""

    replicas: int
    reason: str  # one word, for status and Events: Panic, AboveTarget, BelowTarget...
    message: str  # the numbers behind it
    state: State
    demand: float | None = None  # stable demand in replicas (None: nothing measured)
    panic: bool = False
    arrival_rate: float | None = None  # requests per second over the stable window
    service_time: float | None = None  # mean seconds in the batch per request

    @property
    def measured(self) -> bool:
        """Whether this tick had metrics to decide on."""
        return self.demand is not None


def _signals(policy: Policy, samples: Iterable[PodSample]) -> tuple[float, float]:
    """The queue signal, and the largest of the others (running, KV cache), in replicas."""
    samples = list(samples)
    queue = sum(s.queue for s in samples) / policy.target_queue_depth
    others = [0.0]
    if policy.target_running_requests:
        others.append(sum(s.running for s in samples) / policy.target_running_requests)
    if policy.target_kv_cache_usage:
        others.append(sum(s.kv_cache_usage for s in samples) / policy.target_kv_cache_usage)
    return queue, max(others)


def demand(policy: Policy, samples: Iterable[PodSample]) -> float:
    """Replicas the measured pods' load asks for: the largest signal over its target."""
    return max(_signals(policy, samples))


def arrivals(obs: Observation) -> float | None:
    """Requests per second into all ready pods; None unless every ready pod told its rate.

    A pod that did not answer, or whose rate is not known (its first scrape, a
    counter that went back), makes the total unknown: a partial sum would read
    as less demand than there is.
    """
    samples = obs.samples
    if not samples or len(samples) < obs.ready or any(s.arrivals is None for s in samples):
        return None
    return sum(s.arrivals or 0.0 for s in samples)


def _refusing(obs: Observation) -> bool:
    """Whether a pod turned requests away since it was last read (its queue is full)."""
    return any(s.refused for s in obs.samples)


def _known_mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _window(points: tuple[Point, ...], now: float, seconds: float) -> list[Point]:
    """The points of the last `seconds` (at least the newest one)."""
    inside = [p for p in points if p.time > now - seconds]
    return inside or list(points[-1:])


def _clamp(value: int, policy: Policy) -> int:
    return max(policy.min_replicas, min(policy.max_replicas, value))


def _bound_reason(bounded: int, wanted: int, current: int, policy: Policy, reason: str) -> str:
    """The reason once a bound has cut the count `wanted` to `bounded`.

    A bound is the reason when it restores the bounds (the count was outside
    them) or holds the count where it is; a scale-up that a bound only caps
    keeps its own reason.
    """
    if bounded > wanted:
        return "BelowMinReplicas" if current < policy.min_replicas else "AtMinReplicas"
    if current > policy.max_replicas:
        return "AboveMaxReplicas"
    return "AtMaxReplicas" if bounded == current else reason


def _hold(policy: Policy, state: State, obs: Observation, reason: str, message: str) -> Decision:
    """No measurement this tick: keep the count (within bounds)."""
    replicas = _clamp(obs.replicas, policy)
    if replicas != obs.replicas:
        reason = _bound_reason(replicas, obs.replicas, obs.replicas, policy, reason)
        message = f"{message}; bounds are [{policy.min_replicas}, {policy.max_replicas}]"
    return Decision(replicas, reason, message, replace(state, decided=replicas, ready=0))


def decide(policy: Policy, state: State, obs: Observation) -> Decision:
    """The replica count for this tick (see the module docstring for the rules)."""
    now, current = obs.time, obs.replicas
    if state.decided is not None and state.decided != current:
        # Someone else scaled (kubectl scale, a write that failed): start the
        # stabilization history afresh so their count stands for a full window.
        state = replace(state, recommendations=(), since=None, panic_until=None, panic_since=None)
    if state.since is None:
        state = replace(state, since=now)

    if obs.ready == 0:
        if current == 0:
            return _hold(
                policy,
                state,
                obs,
                "ScaledToZero",
                "no replica to measure: requests fail until the scale subresource is set above 0",
            )
        return _hold(
            policy,
            state,
            obs,
            "NoReadyPods",
            f"no ready pod to measure ({obs.starting} starting): holding {current}",
        )

    samples = obs.samples
    missing = obs.unanswered
    queue_now, other_now = _signals(policy, samples) if samples else (0.0, 0.0)
    up_now = max(queue_now, other_now)
    timed = [s for s in samples if s.finished is not None and s.busy_seconds is not None]
    horizon = max(policy.stable_window, policy.panic_window)
    points = tuple(p for p in state.points if p.time > now - horizon) + (
        Point(
            now,
            up_now,
            up_now + missing + obs.starting,
            queue=queue_now,
            other=other_now,
            arrivals=arrivals(obs),
            finished=sum(s.finished or 0.0 for s in timed),
            busy_seconds=sum(s.busy_seconds or 0.0 for s in timed),
        ),
    )
    stable = _window(points, now, policy.stable_window)
    recent = _window(points, now, policy.panic_window)
    capacity = max(current, 1)  # ready and starting pods alike: what is already ordered
    grown_at = now if obs.ready > state.ready and state.points else state.grown_at
    settled = not obs.starting and (grown_at is None or now - grown_at >= policy.stable_window)

    # The panic starts on what the pods show (the queue reacts within a tick).
    observed_recent = _mean([p.up for p in recent])
    panicking_now = observed_recent >= PANIC_THRESHOLD * capacity
    was_panic = state.panic_until is not None and now < state.panic_until
    panic_until = now + policy.stable_window if panicking_now else state.panic_until
    panic = panic_until is not None and now < panic_until
    panic_since = None
    if panic:
        panic_since = state.panic_since if was_panic and state.panic_since is not None else now

    # Arrivals (Little's law): the requests per second the pods receive, times
    # the mean time a request spends in the batch, is the batch the arrivals
    # keep busy; over the batch target it is the replicas they ask for. The
    # short-term rate is that of the panic so far (a single tick's count is
    # too noisy to size on, and a panic only ever adds), else of the panic window.
    finished = sum(p.finished for p in stable)
    service_time = (
        sum(p.busy_seconds for p in stable) / finished if finished else state.service_time
    )
    rate_stable = _known_mean(p.arrivals for p in stable)
    if panic_since is not None:
        rate_recent = _known_mean(p.arrivals for p in stable if p.time >= panic_since)
    else:
        rate_recent = _known_mean(p.arrivals for p in recent)
    if rate_recent is None:
        rate_recent = rate_stable
    batch = policy.batch_target
    sized = service_time is not None and service_time > 0 and batch is not None
    arrival_stable = (
        rate_stable * service_time / batch if sized and rate_stable is not None else None
    )
    arrival_recent = (
        rate_recent * service_time / batch if sized and rate_recent is not None else None
    )
    # A queue stays in the pod it reached: pods added now take new arrivals,
    # not that backlog, so the queue asks for no more replicas than the
    # arrivals do while the capacity ordered comes up, and after, as long
    # as the backlog drains. A queue that does not drain once that capacity
    # serves is demand the arrivals understate: a batch that cannot reach its
    # target, clients that send only when answered (their rate is the pods'
    # throughput), requests refused before they count.
    stuck = settled and queue_now >= _mean([p.queue for p in stable])
    cap = None
    if (
        arrival_recent is not None
        and arrival_stable is not None
        and not stuck
        and not _refusing(obs)
    ):
        cap = max(arrival_recent, arrival_stable)

    def up(window: list[Point], rate: float | None) -> float:
        if cap is None:
            observed = _mean([p.up for p in window])
        else:
            observed = _mean([min(p.up, cap) for p in window])
        return max(observed, rate or 0.0)

    stable_up = up(stable, arrival_stable)
    stable_down = max(_mean([p.down for p in stable]), arrival_stable or 0.0)
    panic_up = up(recent, arrival_recent)
    measured = f"{len(samples)} of {obs.ready} ready pods measured"
    if arrival_stable is not None and rate_stable is not None and service_time is not None:
        measured += (
            f"; {rate_stable:.2f} req/s x {service_time:.1f} s in the batch = "
            f"{arrival_stable:.1f} replicas"
        )
    if panic:
        raw = max(current, math.ceil(max(panic_up, stable_up)))
        reason = "Panic"
        message = (
            f"panic: short-window demand {observed_recent:.1f} replicas against {current}"
            + (f", arrivals justify {panic_up:.1f}" if cap is not None else "")
            + f" ({measured})"
        )
    elif stable_up > current * (1 + TOLERANCE):
        raw, reason = math.ceil(stable_up), "AboveTarget"
        message = f"demand {stable_up:.2f} replicas over {current} ({measured})"
    elif stable_down < current * (1 - TOLERANCE):
        raw, reason = math.ceil(stable_down), "BelowTarget"
        message = f"demand {stable_down:.2f} replicas under {current} ({measured})"
    else:
        raw, reason = current, "WithinTolerance"
        message = f"demand {stable_up:.2f} replicas, within {TOLERANCE:.0%} of {current}"

    if raw == current and reason in ("AboveTarget", "BelowTarget"):
        reason = "AtTarget"
        message = f"demand {stable_up:.2f} replicas: {current} is right ({measured})"
    busy = any(s.queue or s.running or s.arrivals for s in samples)
    if raw == 0 and (busy or missing):
        raw = 1  # never to zero while a request waits, runs or arrives, or a pod is unmeasured
    if raw > current and obs.starting and not panicking_now:
        raw, reason = current, "CapacityComing"
        message = f"{obs.starting} pods starting count as capacity coming; {message}"
    elif (
        raw > current
        and not panicking_now
        and grown_at is not None
        and now - grown_at < policy.stable_window
    ):
        raw, reason = current, "CapacityComing"
        message = (
            f"pods became ready {now - grown_at:.0f} s ago: the {policy.stable_window:.0f} s "
            f"average has not seen them serve yet; {message}"
        )
    if raw < current and len(samples) * 2 < obs.ready:
        raw, reason = current, "FewPodsAnswered"
        message = f"only {measured}: holding {current}"

    recommendations = tuple(
        (t, r)
        for t, r in state.recommendations
        if t > now - max(policy.scale_up_stabilization, policy.scale_down_stabilization)
    ) + ((now, raw),)
    replicas = raw
    if raw > current and policy.scale_up_stabilization:
        window = [r for t, r in recommendations if t > now - policy.scale_up_stabilization]
        replicas = max(current, min(window or [raw]))
    elif raw < current:
        if now - state.since < policy.scale_down_stabilization:
            replicas, reason = current, "ScaleDownWindow"
            message = f"{message}; less than {policy.scale_down_stabilization:.0f} s of history"
        else:
            window = [
                r for t, r in recommendations if t > now - policy.scale_down_stabilization
            ] or [raw]
            replicas = min(current, max(window))
            if replicas == current:
                reason = "ScaleDownWindow"
                message = (
                    f"{message}; the last {policy.scale_down_stabilization:.0f} s asked "
                    f"for up to {max(window)}"
                )

    if replicas > current:
        step = max(
            policy.scale_up_max_step_pods,
            math.ceil(current * policy.scale_up_max_step_percent / 100),
        )
        if replicas > current + step:
            replicas = current + step
            message = f"{message}; step limited to +{step}"
    elif policy.scale_down_max_step_pods and replicas < current - policy.scale_down_max_step_pods:
        replicas = current - policy.scale_down_max_step_pods
        message = f"{message}; step limited to -{policy.scale_down_max_step_pods}"

    bounded = _clamp(replicas, policy)
    if bounded != replicas:
        reason = _bound_reason(bounded, replicas, current, policy, reason)
        message = f"{message}; bounds are [{policy.min_replicas}, {policy.max_replicas}]"
    next_state = State(
        points=points,
        recommendations=recommendations,
        since=state.since,
        panic_until=panic_until,
        panic_since=panic_since,
        decided=bounded,
        ready=obs.ready,
        grown_at=grown_at,
        service_time=service_time,
    )
    return Decision(
        bounded,
        reason,
        message,
        next_state,
        demand=stable_up,
        panic=panic,
        arrival_rate=rate_stable,
        service_time=service_time,
    )
