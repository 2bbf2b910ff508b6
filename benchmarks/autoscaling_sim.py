"""A trace-driven simulator of LLMService autoscaling: pods, queues, and three policies.

The workload is a Poisson process whose rate steps up for a burst and back.
Each pod is a runtime with `slots` sequences in its batch (`maxNumSeqs`): a
request waits in its pod's queue until a slot frees, then holds the slot for
TTFT + (output_len - 1) x TPOT, both measured with `pagoda bench serve` at
that concurrency. Requests are spread round robin over the ready pods and
never move between pods once queued (a Service does not move them). A pod
ordered at time t is ready at t + `pod_start`; a pod removed stops taking
requests, finishes what it holds, then goes (and costs replica-seconds until
then, as a draining pod does).

The policies see what the operator sees: every `interval` seconds, each ready
pod's waiting and running counts, and its counters: requests received, and
requests finished with their time in the batch (the runtime's
`pagoda:requests_received_total` and `vllm:request_inference_time_seconds`).
The built-in policy is `pagoda.operator.scaler.decide` itself (imported, not
copied), fed through the operator's own `scrape.Rates`, with the defaults of
`spec.autoscaling`. The others are a fixed count sized for the
peak, and a KEDA-style threshold rule (HPA's `ceil(total / target)` on the
queue, polled every 30 s, a 300 s cooldown before any scale-down).

Everything here is pure and seeded: one call, one answer.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pagoda.operator.model import AutoscalingSpec
from pagoda.operator.scaler import Observation, Policy, State, decide
from pagoda.operator.scrape import Rates, Reading


@dataclass(frozen=True, slots=True)
class Workload:
    """Poisson arrivals: `base` req/s, `burst` req/s between `burst_start` and `burst_end`."""

    base: float
    burst: float
    burst_start: float
    burst_end: float
    duration: float
    seed: int = 0

    def rate(self, t: float) -> float:
        return self.burst if self.burst_start <= t < self.burst_end else self.base

    def arrivals(self) -> list[float]:
        """Arrival times (thinning of a Poisson process at the highest rate)."""
        rng = random.Random(self.seed)
        top = max(self.base, self.burst)
        out, t = [], 0.0
        while True:
            t += rng.expovariate(top)
            if t >= self.duration:
                return out
            if rng.random() < self.rate(t) / top:
                out.append(t)


@dataclass(frozen=True, slots=True)
class Service:
    """One pod's serving: batch slots and the measured per-request latencies."""

    slots: int
    ttft: float
    tpot: float
    output_len: int
    pod_start: float

    @property
    def service_time(self) -> float:
        return self.ttft + (self.output_len - 1) * self.tpot

    def capacity(self) -> float:
        """Requests per second one pod finishes when its batch is full."""
        return self.slots / self.service_time


@dataclass(slots=True)
class Pod:
    ready_at: float
    name: int = 0
    queue: deque[float] = field(default_factory=deque)  # arrival times
    busy_until: list[float] = field(default_factory=list)  # one per running request
    removed: bool = False
    # The runtime's counters: requests received, finished, their time in the batch.
    received: int = 0
    finished: int = 0
    busy_seconds: float = 0.0

    def ready(self, t: float) -> bool:
        return not self.removed and t >= self.ready_at


@dataclass(frozen=True, slots=True)
class PodView:
    """What a policy sees of one ready pod (its /metrics)."""

    name: int
    waiting: int
    running: int
    received: int = 0
    finished: int = 0
    busy_seconds: float = 0.0


@dataclass(slots=True)
class Trace:
    """What happened: per tick, and per request."""

    times: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)  # ordered (the scale subresource)
    queue: list[int] = field(default_factory=list)  # waiting, summed over pods
    queue_times: list[float] = field(default_factory=list)  # one per started request
    replica_seconds: float = 0.0
    unserved: int = 0  # still queued at the end

    def summary(self) -> dict[str, float]:
        waits = sorted(self.queue_times)

        def pct(p: float) -> float:
            return waits[min(len(waits) - 1, math.ceil(p / 100 * len(waits)) - 1)]

        return {
            "requests": len(waits),
            "unserved": self.unserved,
            "queue_p50_s": pct(50),
            "queue_p99_s": pct(99),
            "queue_mean_s": statistics.fmean(waits),
            "replica_seconds": self.replica_seconds,
            "peak_replicas": max(self.replicas),
        }


# (time, replicas ordered now, the ready pods, pods starting) -> replicas
Decide = Callable[[float, int, list[PodView], int], int]


def fixed(replicas: int) -> Decide:
    """Always `replicas`."""
    return lambda t, current, pods, starting: replicas


def builtin(policy: Policy, counters: bool = True) -> Decide:
    """The operator's own scaler (`pagoda.operator.scaler.decide`), state carried between ticks.

    The pods' counters go through the operator's `Rates`, as scraped ones do;
    `counters=False` hides them (a runtime without the series: gauges only).
    """
    state = State()
    rates = Rates()

    def run(t: float, current: int, pods: list[PodView], starting: int) -> int:
        nonlocal state
        rates.keep(str(p.name) for p in pods)
        samples = tuple(
            rates.sample(
                str(p.name),
                t,
                Reading(
                    queue=p.waiting,
                    running=p.running,
                    received=p.received if counters else None,
                    finished=p.finished if counters else None,
                    busy_seconds=p.busy_seconds if counters else None,
                ),
            )
            for p in pods
        )
        obs = Observation(t, current, len(pods), starting, samples)
        decision = decide(policy, state, obs)
        state = decision.state
        return decision.replicas

    return run


def threshold_rule(
    target: float, min_replicas: int, max_replicas: int, poll: float = 30.0, cooldown: float = 300.0
) -> Decide:
    """KEDA's Prometheus trigger through its HPA: `ceil(sum waiting / target)`, polled.

    Scale-up at each poll (HPA's default step: +100% or +4 pods, whichever
    is more); a scale-down only to the highest count of the last `cooldown`
    seconds; HPA's 10% tolerance. Starting pods are not looked at.
    """
    last_poll = -math.inf
    history: deque[tuple[float, int]] = deque()

    def run(t: float, current: int, pods: list[PodView], starting: int) -> int:
        nonlocal last_poll
        if t - last_poll < poll:
            return current
        last_poll = t
        waiting = sum(p.waiting for p in pods)
        want = math.ceil(waiting / target) if pods else current
        if current and abs(want / current - 1) <= 0.1:
            want = current
        want = max(min_replicas, min(max_replicas, want))
        history.append((t, want))
        while history and history[0][0] <= t - cooldown:
            history.popleft()
        if want > current:
            return min(want, current + max(4, current))
        return min(current, max(r for _, r in history))

    return run


def default_policy(
    max_replicas: int, max_num_seqs: int | None = None, **overrides: object
) -> Policy:
    """`spec.autoscaling` with its defaults (and `overrides`, by spec field name)."""
    return Policy.from_spec(
        AutoscalingSpec.model_validate({"maxReplicas": max_replicas, **overrides}), max_num_seqs
    )


def simulate(
    workload: Workload,
    service: Service,
    policy: Decide,
    initial: int,
    interval: float = 5.0,
    dt: float = 0.05,
) -> Trace:
    """Run the workload against pods scaled by `policy`; `dt` is the time step."""
    arrivals = deque(workload.arrivals())
    names = iter(range(1 << 30))
    pods = [Pod(ready_at=0.0, name=next(names)) for _ in range(initial)]
    trace = Trace()
    rr = 0
    next_tick = 0.0
    t = 0.0
    s = service.service_time
    while t < workload.duration:
        # Arrivals go round robin to the ready pods (to a starting one if none is ready:
        # the request fails on a real cluster; here it waits, and is counted).
        while arrivals and arrivals[0] <= t:
            arrived = arrivals.popleft()
            ready = [p for p in pods if p.ready(t)] or [p for p in pods if not p.removed]
            if not ready:
                trace.unserved += 1
                continue
            target = ready[rr % len(ready)]
            target.queue.append(arrived)
            target.received += 1
            rr += 1
        for pod in pods:
            done = sum(1 for b in pod.busy_until if b <= t)
            if done:
                pod.busy_until = [b for b in pod.busy_until if b > t]
                pod.finished += done
                pod.busy_seconds += done * s
            if t < pod.ready_at:
                continue
            while pod.queue and len(pod.busy_until) < service.slots:
                arrived = pod.queue.popleft()
                trace.queue_times.append(t - arrived)
                pod.busy_until.append(t + s)
        pods = [p for p in pods if not (p.removed and not p.queue and not p.busy_until)]
        trace.replica_seconds += dt * len(pods)
        if t >= next_tick:
            next_tick += interval
            live = [p for p in pods if not p.removed]
            ready = [p for p in live if p.ready(t)]
            starting = len(live) - len(ready)
            seen = [
                PodView(
                    p.name, len(p.queue), len(p.busy_until), p.received, p.finished, p.busy_seconds
                )
                for p in ready
            ]
            want = policy(t, len(live), seen, starting)
            if want > len(live):
                pods += [
                    Pod(ready_at=t + service.pod_start, name=next(names))
                    for _ in range(want - len(live))
                ]
            elif want < len(live):
                # The Deployment removes pods not ready first, then the newest.
                order = sorted(live, key=lambda p: (p.ready(t), -p.ready_at))
                for pod in order[: len(live) - want]:
                    pod.removed = True
            trace.times.append(t)
            trace.replicas.append(want)
            trace.queue.append(sum(len(p.queue) for p in pods))
        t += dt
    trace.unserved += sum(len(p.queue) for p in pods)
    return trace
