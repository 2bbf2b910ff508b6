"""What each kopf handler does, in plain functions; main.py only wires decorators.

One sync loop per LLMService (loops.py) owns everything that object
needs: it reconciles when woken by a watch event of the LLMService or of one of
its children, and every `resync_seconds` as a safety net. Being the only
writer of its object's children and status, it needs no lock, and it knows
the status it last wrote. The handlers translate between kopf (body, memo,
stop flag) and the domain (`reconcile`), and do the side effects around it:
the status write, the Events, the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf
from pagoda.operator import adapters as lora
from pagoda.operator import metrics
from pagoda.operator import reconcile as rc
from pagoda.operator import status as st
from pagoda.operator.api import KubeApi
from pagoda.operator.autoscaler import Autoscaler, Health
from pagoda.operator.config import OperatorConfig
from pagoda.operator.errors import ApiError, Backoff
from pagoda.operator.llmservice import InvalidSpec, builtin_autoscaling, parse
from pagoda.operator.loops import Loop, Loops
from pagoda.operator.model_download import ProgressReader
from pagoda.operator.render.labels import MANAGED_BY, MANAGED_BY_LABEL, selector_labels
from pagoda.operator.scrape import HttpFetch
from pagoda.operator.triggers import SERVICE_NAME_LABEL, Key, Triggers, owner_key

FINALIZER = "pagoda.dev/finalizer"
PREFIX = "pagoda.dev"
# Kubernetes 1.30 turned on the native `sleep` preStop action by default.
SLEEP_ACTION_SINCE = (1, 30)


def configure(settings: kopf.OperatorSettings, memo: kopf.Memo) -> None:
    """Operator-wide settings and shared state, once at start-up."""
    # Without timeouts a watch that the API server or a load balancer silently
    # drops never ends, and the operator goes blind after hours.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    # Our own annotations, not kopf's defaults. No handler needs a finalizer,
    # so kopf adds none; naming the one earlier versions added makes kopf
    # remove it from the objects that still carry it.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    # Events are posted deliberately (kopf.event); log lines below WARNING stay logs.
    settings.posting.level = logging.WARNING
    if "config" not in memo:
        memo["config"] = OperatorConfig.from_env()
    memo.setdefault("triggers", Triggers())
    memo.setdefault("api", KubeApi.from_environment())
    # How the autoscaler reads pods' /metrics (tests may bring a network of their own).
    memo.setdefault("scrape", HttpFetch())
    # Each autoscaler's health, for its sync loop's ScalingActive condition.
    memo.setdefault("scaling", {})
    # How the adapter loops call pods' LoRA API, and each one's health (AdaptersReady).
    memo.setdefault("pod_client", lora.HttpPodClient())
    memo.setdefault("adapters", {})
    # Wake-ups of the adapter loops: a new spec, a pod that changed.
    memo.setdefault("adapter_triggers", Triggers())
    # The per-LLMService loops; their warnings become Events, as kopf's daemons' do.
    memo.setdefault(
        "loops",
        Loops(
            LOOPS,
            logger_for=lambda body: kopf.ObjectLogger(body=kopf.Body(body), settings=settings),
        ),
    )
    # How the sync loops read hf:// downloads' GET /progress (ModelReady).
    memo.setdefault("download_progress", ProgressReader())


def child_selector(resource: Sequence[str]) -> str:
    """The server-side label selector of one owned kind's watch.

    Every child carries the managed-by label. EndpointSlices are the
    EndpointSlice controller's, which copies its Service's labels onto them;
    the service-name label is what maps a slice to its owner.
    """
    selector = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    if resource[-1] == "endpointslices":
        selector += f",{SERVICE_NAME_LABEL}"
    return selector


def watch_selectors(settings: kopf.OperatorSettings, resources: Iterable[Sequence[str]]) -> None:
    """Filter the owned kinds' lists and watches on the API server, not in kopf.

    A handler's `labels=` filter runs in kopf after the whole stream arrived:
    on a cluster with 50,000 pods every one of them would be listed, watched
    and kept in the operator's memory.
    """
    for resource in resources:
        settings.watching.label_selectors[tuple(resource)] = child_selector(resource)


async def detect_cluster(memo: kopf.Memo, logger: Any) -> None:
    """Adapt the rendering to the cluster: the native sleep action needs 1.30+."""
    api: KubeApi = memo["api"]
    try:
        version = await api.server_version()
    except ApiError as e:
        version = None
        logger.warning(f"cannot read the API server's version ({e}); preStop uses exec sleep")
    supported = version is not None and version >= SLEEP_ACTION_SINCE
    memo["config"] = dataclasses.replace(memo["config"], sleep_action=supported)


def login(memo: kopf.Memo) -> kopf.ConnectionInfo:
    """kopf's credentials are the official client's: one source for both.

    kopf calls this again after a 401; the client then re-reads its
    credentials (a rotated token file, a fresh exec-plugin token).
    """
    if "api" in memo:
        memo["api"].reload()
    else:
        memo["api"] = KubeApi.from_environment()
    return memo["api"].connection_info()


def child_changed(kind: str, body: Mapping[str, Any], memo: kopf.Memo) -> None:
    """A watched child changed: wake the loop of the LLMService that owns it.

    A pod's change also wakes the adapter loop: a pod turning ready gets its
    adapters checked at once.
    """
    key = owner_key(kind, body)
    memo["triggers"].poke(key)
    if kind == "Pod" and "adapter_triggers" in memo:
        memo["adapter_triggers"].poke(key)


def llmservice_changed(body: Mapping[str, Any], memo: kopf.Memo) -> None:
    """The LLMService changed: wake its loop if its spec did (not for our status writes)."""
    meta = body.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    memo["triggers"].poke_if_new_generation(key, meta.get("generation"))
    if "adapter_triggers" in memo:
        memo["adapter_triggers"].poke_if_new_generation(key, meta.get("generation"))


def run_loops(event_type: str | None, body: Mapping[str, Any], memo: kopf.Memo) -> None:
    """An LLMService's watch event: start or stop its loops to match (see loops.py)."""
    memo["loops"].observe(event_type, body, memo)


async def _woken(event: asyncio.Event | None, stopped: Any, timeout: float) -> str:
    """Wait for a wake-up (unless `event` is None), a stop or the timeout; say which came first."""
    waiters = {asyncio.ensure_future(stopped.wait())}
    if event is not None:
        waiters.add(asyncio.ensure_future(event.wait()))
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    if stopped:
        return "stop"
    return "watch" if event is not None and event.is_set() else "resync"


@dataclass(slots=True)
class Memory:
    """What one sync loop remembers between passes."""

    # The status as last written: this loop is its only writer.
    status: dict[str, Any] = field(default_factory=dict)
    # The unknown spec fields last logged (logged again only when they change).
    ignored: tuple[str, ...] = ()
    # The last reconcile asked to run again this soon (a download in progress).
    requeue_after: float | None = None


async def keep_in_sync(body: kopf.Body, memo: kopf.Memo, stopped: Any, logger: Any) -> None:
    """The sync loop of one LLMService, until it is stopped (deletion or shutdown)."""
    config: OperatorConfig = memo["config"]
    meta = body.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    triggers: Triggers = memo["triggers"]
    wake = triggers.register(key)
    backoff = Backoff(first=1.0, cap=config.resync_seconds)
    memory = Memory(status=copy.deepcopy(dict(body.get("status") or {})))
    trigger = "start"
    try:
        while not stopped:
            wake.event.clear()
            if (body.get("metadata") or {}).get("deletionTimestamp"):
                break  # being deleted: children go with their owner
            generation = (body.get("metadata") or {}).get("generation")
            try:
                await reconcile_once(body, memo, memory, logger, trigger)
                wake.generation = generation
                backoff.reset()
                resync = min(config.resync_seconds, memory.requeue_after or config.resync_seconds)
                reason = await _woken(wake.event, stopped, resync)
            except ApiError as e:  # transient: permanent ones became conditions
                delay = backoff.next()
                logger.warning(f"reconcile failed, retrying in {delay:.0f}s: {e}")
                # Watch events do not cut a backoff short (a throttled or
                # failing API server gets no more calls); they are kept for later.
                reason = "retry" if await _woken(None, stopped, delay) != "stop" else "stop"
            if reason == "stop":
                break
            trigger = reason
            if reason == "watch":
                # A rollout sends a burst of events: answer them with one pass.
                await asyncio.sleep(config.settle_seconds)
    finally:
        triggers.unregister(key, wake)


async def reconcile_once(
    body: kopf.Body, memo: kopf.Memo, memory: Memory, logger: Any, trigger: str
) -> None:
    """One reconcile, then the status write and the Events."""
    api: KubeApi = memo["api"]
    config: OperatorConfig = memo["config"]
    meta = body.get("metadata") or {}
    started = time.monotonic()
    now = datetime.datetime.now(datetime.timezone.utc)
    key = (meta.get("namespace", ""), meta.get("name", ""))
    health: Health | None = memo.get("scaling", {}).get(key)
    scaling = (health.active, health.reason, health.message) if health else None
    adapters: lora.Health | None = memo.get("adapters", {}).get(key)
    try:
        outcome = await rc.reconcile(
            body,
            api,
            config,
            memory.status,
            now,
            scaling,
            adapters,
            progress=memo.get("download_progress"),
            cache=memo.get("children"),
            full=trigger != "watch",
        )
    except Exception:
        metrics.RECONCILES.labels(trigger, "error").inc()
        raise
    finally:
        metrics.RECONCILE_SECONDS.labels(trigger).observe(time.monotonic() - started)
    for write in outcome.writes:
        metrics.CHILD_WRITES.labels(write.kind, write.action.value).inc()
        kind, reason, message = write.event()
        kopf.event(body, type=kind, reason=reason, message=message)
    if outcome.ignored_fields and outcome.ignored_fields != memory.ignored:
        logger.warning(
            "ignoring fields this operator does not know (written for a newer CRD?): "
            + ", ".join(outcome.ignored_fields)
        )
    memory.ignored = outcome.ignored_fields
    memory.requeue_after = outcome.requeue_after
    changes = st.changes(memory.status, outcome.status)
    if changes:
        # The whole status this loop owns: a field it leaves out is removed.
        owned = {**st.owned(memory.status), **outcome.status}
        try:
            await api.apply_status(
                meta.get("namespace", ""), meta.get("name", ""), owned, config.field_manager
            )
        except ApiError as e:
            if not e.permanent:
                raise
            logger.error(f"the status was refused: {e}")
            return
    # Condition changes are told once, after the status that carries them is stored.
    for kind, reason, message in st.transitions(memory.status, outcome.status):
        kopf.event(body, type=kind, reason=reason, message=message)
    memory.status = {**memory.status, **changes}
    if outcome.invalid is not None:
        logger.warning(f"not reconciled: {outcome.invalid}")
    metrics.RECONCILES.labels(trigger, "invalid" if outcome.invalid else "ok").inc()


def wants_autoscaler(spec: Mapping[str, Any]) -> bool:
    """Whether a raw spec asks for the built-in autoscaler (the filter of its loop).

    Read from the raw spec, before validation: an invalid spec still gets its
    loop, which holds until the sync loop's InvalidSpec condition is fixed.
    """
    auto = spec.get("autoscaling")
    if not isinstance(auto, Mapping):
        return False
    return auto.get("enabled", True) is not False and auto.get("mode", "builtin") == "builtin"


def _set_health(memo: kopf.Memo, key: Key, health: Health | None) -> None:
    """Record the autoscaler's health; wake the sync loop when the condition must change."""
    registry: dict[Key, Health] = memo["scaling"]
    before = registry.get(key)
    if health is None:
        registry.pop(key, None)
    else:
        registry[key] = health
    if (before and (before.active, before.reason)) != (health and (health.active, health.reason)):
        memo["triggers"].poke(key)


async def keep_scaled(body: kopf.Body, memo: kopf.Memo, stopped: Any, logger: Any) -> None:
    """The built-in autoscaler of one LLMService: a tick every metricsIntervalSeconds.

    Nothing a pod or a spec says may end this loop: an invalid spec holds
    (the sync loop reports it), a tick that fails is logged and the next one
    runs on time.
    """
    config: OperatorConfig = memo["config"]
    meta = body.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    written = (body.get("status") or {}).get("autoscaling") or {}
    scaler = Autoscaler(
        memo["api"],
        memo["scrape"],
        written=copy.deepcopy(dict(written)),
        cache=memo.get("children"),
    )
    interval = 5.0
    try:
        while not stopped:
            started = time.monotonic()
            try:
                llms = parse(body, config)
            except InvalidSpec:
                llms = None  # the sync loop's condition says why; hold
            if llms is not None and builtin_autoscaling(llms):
                assert llms.spec.autoscaling is not None
                interval = float(llms.spec.autoscaling.metrics_interval_seconds)
                try:
                    result = await scaler.tick(
                        llms,
                        selector_labels(llms),
                        time.monotonic(),
                        datetime.datetime.now(datetime.timezone.utc),
                    )
                except ApiError as e:
                    logger.warning(f"autoscaler tick failed, next in {interval:.0f}s: {e}")
                except Exception as e:  # a bug must not stop scaling for good
                    logger.exception(f"autoscaler tick crashed: {e}")
                else:
                    for kind, reason, message in result.events:
                        kopf.event(body, type=kind, reason=reason, message=message)
                    _set_health(memo, key, result.health)
            elapsed = time.monotonic() - started
            if await _woken(None, stopped, max(0.0, interval - elapsed)) == "stop":
                break
    finally:
        _set_health(memo, key, None)
        deleting = bool((body.get("metadata") or {}).get("deletionTimestamp"))
        if not deleting and not wants_autoscaler(body.get("spec") or {}):
            # Switched off or to KEDA: what this loop measured no longer holds.
            with contextlib.suppress(ApiError):
                await memo["api"].patch_status(key[0], key[1], {"autoscaling": None})


def wants_adapters(spec: Mapping[str, Any]) -> bool:
    """Whether a raw spec turns LoRA on (the filter of the adapter loop)."""
    return spec.get("lora") is not None or bool(spec.get("adapters"))


def _set_adapters_health(memo: kopf.Memo, key: Key, health: lora.Health | None) -> None:
    """Record the adapter loop's health; wake the sync loop when the condition changes."""
    registry: dict[Key, lora.Health] = memo["adapters"]
    before = registry.get(key)
    if health is None:
        registry.pop(key, None)
    else:
        registry[key] = health
    if before != health:
        memo["triggers"].poke(key)


async def keep_adapters(body: kopf.Body, memo: kopf.Memo, stopped: Any, logger: Any) -> None:
    """The adapter loop of one LLMService: every ready pod serves `spec.adapters`.

    Each pass reads every ready pod's /v1/models and loads or unloads what
    differs (`adapters.AdapterSync`): at once when the spec or a pod changes,
    then every second while some pod differs and every `adapter_sync_seconds`
    once all match, backed off while pods refuse the admin key. As the
    autoscaler's loop, nothing a pod or a spec says ends it.
    """
    config: OperatorConfig = memo["config"]
    meta = body.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    written = (body.get("status") or {}).get("adapters")
    sync = lora.AdapterSync(memo["api"], memo["pod_client"], written=written)
    triggers: Triggers = memo["adapter_triggers"]
    wake = triggers.register(key)
    try:
        while not stopped:
            wake.event.clear()
            generation = (body.get("metadata") or {}).get("generation")
            interval = 1.0
            try:
                llms = parse(body, config)
            except InvalidSpec:
                llms = None  # the sync loop's condition says why; hold
            if llms is not None and llms.spec.lora_enabled:
                try:
                    result = await sync.tick(llms, selector_labels(llms))
                except ApiError as e:
                    logger.warning(f"adapter sync failed, retrying: {e}")
                except Exception as e:  # a bug must not stop the loop for good
                    logger.exception(f"adapter sync crashed: {e}")
                else:
                    for kind, reason, message in result.events:
                        kopf.event(body, type=kind, reason=reason, message=message)
                    _set_adapters_health(memo, key, result.health)
                    if result.converged:
                        interval = config.adapter_sync_seconds
                    if result.retry_after is not None:
                        interval = result.retry_after
            wake.generation = generation
            if await _woken(wake.event, stopped, interval) == "stop":
                break
    finally:
        triggers.unregister(key, wake)
        _set_adapters_health(memo, key, None)
        deleting = bool((body.get("metadata") or {}).get("deletionTimestamp"))
        if not deleting and not wants_adapters(body.get("spec") or {}):
            with contextlib.suppress(ApiError):  # LoRA switched off: nothing to report
                await memo["api"].patch_status(key[0], key[1], {"adapters": None})


async def cleanup(memo: kopf.Memo) -> None:
    """Stop the loops, then close our connection pools (shutdown)."""
    if "loops" in memo:
        await memo["loops"].stop_all()
    api = memo.get("api")
    if api is not None:
        api.close()
    for client in (memo.get("scrape"), memo.get("pod_client"), memo.get("download_progress")):
        close = getattr(client, "close", None)
        if close is not None:
            await close()


# The loops of one LLMService; each runs while its spec asks for it.
LOOPS = (
    Loop("sync", keep_in_sync),
    Loop("autoscale", keep_scaled, wants_autoscaler),
    Loop("adapters", keep_adapters, wants_adapters),
)
