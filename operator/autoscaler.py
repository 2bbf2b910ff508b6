"""The built-in autoscaler of one LLMService: measure, decide, act, tell.

Every `metricsIntervalSeconds` a tick:

1. reads the scale subresource (the replica count now);
2. lists the runtime pods (from the watch-fed cache when the operator has
   one) and sorts them (`census`): ready ones are read,
   starting ones are capacity that is coming, failing ones are neither;
3. reads each ready pod's /metrics (`scrape`); a pod that does not answer is
   skipped, never counted as idle; its counters, against its previous
   reading, give its arrival rate and its requests' time in the batch (`Rates`);
4. asks the pure scaler (`scaler.decide`) for the replica count;
5. writes the LLMService's scale subresource if the count changed (never the
   Deployment: the sync loop renders the Deployment from `spec.replicas`),
   on the condition that the count is still the one read (`api.scale_patch`);
   a count outside [minReplicas, maxReplicas], say after a GitOps change
   lowered maxReplicas, is brought back within them, as HPA does;
6. writes `status.autoscaling` when the decision changed, its gauges at most
   every `GAUGE_REFRESH_SECONDS` (`status_due`);
7. returns the Events to post (each distinct one at most once per
   `EventLimiter.interval`) and the health that the sync loop turns into
   the `ScalingActive` condition.

The sorting, the observation, the status and the Events are pure functions
below; `Autoscaler.tick` does the I/O around them. The scaler's state lives
in memory: after an operator restart the history starts afresh, and a fresh
history removes nothing for a whole scale-down window (safe by default).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pagoda.operator import metrics
from pagoda.operator.api import KubeApi
from pagoda.operator.cache import ChildCache, Reads
from pagoda.operator.errors import ApiError
from pagoda.operator.events import EventLimiter, EventTuple
from pagoda.operator.llmservice import LLMService
from pagoda.operator.scaler import Decision, Observation, PodSample, Policy, State, decide
from pagoda.operator.scrape import Fetch, Rates, Reading, ScrapeError, Target, scrape, targets
from pagoda.operator.status import FAILING_WAITING, pod_ready, timestamp

Results = Mapping[str, PodSample | ScrapeError]

# The measured values of `status.autoscaling`: refreshed, not written on every change.
GAUGES = frozenset(
    ("queueDepth", "runningRequests", "kvCacheUsage", "arrivalRate", "serviceTimeSeconds")
)
GAUGE_REFRESH_SECONDS = 30.0


def replicas_of(scale: Mapping[str, Any]) -> int:
    """The count of an autoscaling/v1 Scale (its spec.replicas is omitted when 0)."""
    return int((scale.get("spec") or {}).get("replicas") or 0)


@dataclass(frozen=True, slots=True)
class Census:
    """The runtime pods, sorted for the scaler."""

    targets: tuple[Target, ...]  # ready, with an address: read their metrics
    starting: int  # not ready yet, within the startup budget: capacity coming


@dataclass(frozen=True, slots=True)
class Health:
    """Whether the autoscaler can do its job (the ScalingActive condition)."""

    active: bool
    reason: str
    message: str


def _age(pod: Mapping[str, Any], now: datetime.datetime) -> float | None:
    created = (pod.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return None
    try:
        then = datetime.datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (now - then).total_seconds()


def _failing(pod: Mapping[str, Any]) -> bool:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if ((cs.get("state") or {}).get("waiting") or {}).get("reason") in FAILING_WAITING:
            return True
    return False


def census(
    pods: Iterable[Mapping[str, Any]], now: datetime.datetime, startup_budget: float
) -> Census:
    """Sort the pods: which to read, and how many are starting.

    A pod counts as starting while it is not ready, not terminating, not
    failing (a crash loop or an image that cannot be pulled will not bring
    capacity), and younger than the startup probe's budget: a pod that has
    not come up within it never will, and must not hold scale-ups back forever.
    """
    pods = list(pods)
    starting = 0
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or pod_ready(pod) or _failing(pod):
            continue
        age = _age(pod, now)
        if age is None or age <= startup_budget:
            starting += 1
    return Census(tuple(targets(pods)), starting)


def observation(time: float, replicas: int, seen: Census, results: Results) -> Observation:
    """What the scaler sees this tick; failed scrapes are left out, not zeros."""
    samples = tuple(r for r in results.values() if isinstance(r, PodSample))
    return Observation(
        time=time,
        replicas=replicas,
        ready=len(seen.targets),
        starting=seen.starting,
        samples=samples,
    )


def sampled(
    rates: Rates,
    time: float,
    scraped: Iterable[Target],
    readings: Mapping[str, Reading | ScrapeError],
) -> dict[str, PodSample | ScrapeError]:
    """Each pod's reading as a sample with rates since its previous one; errors kept."""
    scraped = list(scraped)
    rates.keep(t.key or t.pod for t in scraped)
    out: dict[str, PodSample | ScrapeError] = {}
    for target in scraped:
        reading = readings.get(target.pod)
        if isinstance(reading, Reading):
            out[target.pod] = rates.sample(target.key or target.pod, time, reading)
        elif reading is not None:
            out[target.pod] = reading
    return out


def failures(results: Results) -> dict[str, ScrapeError]:
    """The pods whose metrics could not be read, by name."""
    return {pod: r for pod, r in results.items() if isinstance(r, ScrapeError)}


def health(obs: Observation, results: Results) -> Health:
    """The ScalingActive condition of this tick."""
    failed = failures(results)
    if obs.replicas == 0:
        return Health(True, "ScaledToZero", "no replica to measure; scale up to serve again")
    if obs.ready == 0:
        return Health(
            False, "NoReadyPods", f"no ready pod to measure ({obs.starting} starting): holding"
        )
    if len(failed) == obs.ready:
        detail = "; ".join(f"{p}: {e}" for p, e in sorted(failed.items())[:3])
        return Health(
            False, "MetricsUnavailable", f"no ready pod's /metrics answered ({detail}): holding"
        )
    measured = f"{obs.ready - len(failed)} of {obs.ready} ready pods measured"
    if failed:
        return Health(True, "PartialMetrics", f"{measured}; skipped: {', '.join(sorted(failed))}")
    return Health(True, "ValidMetrics", measured)


def _round(value: float) -> float:
    return round(value, 3)


def status(
    decision: Decision,
    obs: Observation,
    previous: Mapping[str, Any],
    now: datetime.datetime,
    scaled: bool,
) -> dict[str, Any]:
    """`status.autoscaling` after this tick (the last decision is kept until the next scale)."""
    samples = obs.samples
    out: dict[str, Any] = {
        "mode": "builtin",
        "queueDepth": _round(sum(s.queue for s in samples)) if samples else None,
        "runningRequests": _round(sum(s.running for s in samples)) if samples else None,
        "kvCacheUsage": (
            _round(sum(s.kv_cache_usage for s in samples) / len(samples)) if samples else None
        ),
        # Coarser than the gauges: a rate moves every tick, and each change is a write.
        "arrivalRate": (
            round(decision.arrival_rate, 2) if decision.arrival_rate is not None else None
        ),
        "serviceTimeSeconds": (
            round(decision.service_time, 1) if decision.service_time is not None else None
        ),
        "podsMeasured": len(samples),
        "podsUnanswered": obs.unanswered,
        "podsStarting": obs.starting,
        "desiredReplicas": decision.replicas,
        "panic": decision.panic,
        "lastScaleTime": previous.get("lastScaleTime"),
        "lastDecision": previous.get("lastDecision"),
    }
    if scaled:
        when = timestamp(now)
        out["lastScaleTime"] = when
        out["lastDecision"] = {
            "reason": decision.reason,
            "message": decision.message,
            "from": obs.replicas,
            "to": decision.replicas,
            "time": when,
        }
    return out


def status_due(
    written: Mapping[str, Any],
    new: Mapping[str, Any],
    elapsed: float | None,
    refresh: float,
) -> bool:
    """Whether `status.autoscaling` must be written now.

    The decision and the counts (desiredReplicas, panic, the last decision,
    pods measured...) are written as soon as they change. The gauges
    (`GAUGES`) move on almost every tick; a status write for each would be a
    write, a watch event and a resourceVersion change every few seconds per
    LLMService, so they are refreshed at most every `refresh` seconds
    (`elapsed`: since the last write, None if unknown), or at once when one
    appears or goes (measured, or not measured any more).
    """
    for key, value in new.items():
        before = written.get(key)
        if value == before:
            continue
        if key not in GAUGES or (value is None) != (before is None):
            return True
        if elapsed is None or elapsed >= refresh:
            return True
    return False


def scale_event(decision: Decision, current: int) -> EventTuple | None:
    """The Event of a change of the replica count; None if it did not change."""
    if decision.replicas == current:
        return None
    reason = "ScaledUp" if decision.replicas > current else "ScaledDown"
    text = f"{current} -> {decision.replicas} replicas ({decision.reason}): {decision.message}"
    return "Normal", reason, text


def failure_events(now: Mapping[str, ScrapeError], before: Mapping[str, str]) -> list[EventTuple]:
    """Warnings for pods that newly fail (or fail differently); none while a failure persists."""
    events = []
    for pod, error in sorted(now.items()):
        if before.get(pod) == error.reason:
            continue
        reason = "MetricsMalformed" if error.reason == "Malformed" else "MetricsUnavailable"
        events.append(
            (
                "Warning",
                reason,
                f"pod {pod}: /metrics {error.reason}: {error}; skipped, not counted as idle",
            )
        )
    return events


@dataclass(slots=True)
class TickResult:
    """What one tick did, for the caller to tell."""

    events: list[EventTuple] = field(default_factory=list)
    health: Health | None = None
    decision: Decision | None = None


@dataclass(slots=True)
class Autoscaler:
    """The scaler state and what was last written, for one LLMService."""

    api: KubeApi
    fetch: Fetch
    scrape_timeout: float = 2.0
    concurrency: int = 16
    state: State = field(default_factory=State)
    written: dict[str, Any] = field(default_factory=dict)
    failing: dict[str, str] = field(default_factory=dict)
    rates: Rates = field(default_factory=Rates)
    # The pods as the watches last saw them (None: list them through the API).
    cache: ChildCache | None = None
    # When `written` was written (the clock of `tick`); None: not by this loop.
    written_at: float | None = None
    gauge_refresh: float = GAUGE_REFRESH_SECONDS
    limiter: EventLimiter = field(default_factory=EventLimiter)

    async def tick(
        self, llms: LLMService, selector: Mapping[str, str], clock: float, now: datetime.datetime
    ) -> TickResult:
        """One measurement and decision. Raises ApiError only for transient errors."""
        spec = llms.spec.autoscaling
        assert spec is not None
        ns, name = llms.namespace, llms.name
        current = replicas_of(await self.api.get_scale(ns, name))
        pods = await Reads(self.api, self.cache).list("Pod", ns, selector)
        seen = census(pods, now, float(llms.spec.startup_timeout_seconds))
        readings = await scrape(seen.targets, self.fetch, self.scrape_timeout, self.concurrency)
        results = sampled(self.rates, clock, seen.targets, readings)
        failed = failures(results)
        for error in failed.values():
            metrics.SCRAPE_FAILURES.labels(error.reason).inc()
        obs = observation(clock, current, seen, results)
        policy = Policy.from_spec(spec, llms.spec.engine.max_num_seqs)
        decision = decide(policy, self.state, obs)
        out = TickResult(failure_events(failed, self.failing), health(obs, results), decision)
        self.failing = {pod: e.reason for pod, e in failed.items()}

        scaled = False
        if decision.replicas != current:
            try:
                await self.api.patch_scale(ns, name, decision.replicas, current)
                scaled = True
            except ApiError as e:
                if e.status in (409, 422) and await self._moved(ns, name, current):
                    # Someone scaled between the read and the write (the
                    # write's precondition on the count failed): their count
                    # stands, and the next tick sees it as someone else's.
                    self.state = replace(decision.state, decided=current)
                    out.events = self.limiter.filter(out.events, clock)
                    return out
                if not e.permanent:
                    raise
                out.events.append(
                    ("Warning", "ScaleRefused", f"{current} -> {decision.replicas}: {e}")
                )
                out.health = Health(False, "ScaleRefused", f"the scale write was refused: {e}")
        direction = (
            "up" if decision.replicas > current else "down" if decision.replicas < current else ""
        )
        metrics.SCALE_DECISIONS.labels(direction if scaled else "none", decision.reason).inc()
        if scaled:
            event = scale_event(decision, current)
            if event is not None:
                out.events.append(event)
        # Only a count that was written is this scaler's: a decision that was
        # not would read, next tick, as someone else's scale and wipe the
        # stabilization history and the panic.
        self.state = (
            decision.state
            if scaled or decision.replicas == current
            else replace(decision.state, decided=current)
        )
        new = status(decision, obs, self.written, now, scaled)
        elapsed = None if self.written_at is None else clock - self.written_at
        if status_due(self.written, new, elapsed, self.gauge_refresh):
            await self.api.patch_status(ns, name, {"autoscaling": new})
            self.written = new
            self.written_at = clock
        out.events = self.limiter.filter(out.events, clock)
        return out

    async def _moved(self, namespace: str, name: str, expected: int) -> bool:
        """Whether the replica count is no longer `expected` (read again)."""
        return replicas_of(await self.api.get_scale(namespace, name)) != expected
