"""What each kopf handler does, in plain functions; main.py only wires decorators.

The handlers translate between kopf (body, patch, memo) and the domain
(`reconcile`), and do the side effects kopf owns: the status patch and Events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf
from pagoda.operator import metrics
from pagoda.operator import reconcile as rc
from pagoda.operator import status as st
from pagoda.operator.config import OperatorConfig
from pagoda.operator.kube import Kube

FINALIZER = "pagoda.dev/finalizer"
PREFIX = "pagoda.dev"


def configure(settings: kopf.OperatorSettings, memo: kopf.Memo) -> None:
    """Operator-wide settings, applied once at start-up."""
    # Without timeouts a watch that the API server or a load balancer silently
    # drops never ends, and the operator goes blind after hours.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    # Our own annotations and finalizer, not kopf's defaults.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    # Events are posted deliberately (kopf.event); log lines below WARNING stay logs.
    settings.posting.level = logging.WARNING
    if "config" not in memo:
        memo["config"] = OperatorConfig.from_env()
    memo.setdefault("kube", Kube())


async def login(settings: kopf.OperatorSettings, memo: kopf.Memo) -> kopf.ConnectionInfo:
    """In-cluster service account first, then a kubeconfig; shared with our client."""
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
        settings=settings
    )
    if info is None:
        raise kopf.LoginError("no service account token and no kubeconfig found")
    await memo.setdefault("kube", Kube()).use(info)
    return info


async def reconcile(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any, trigger: str
) -> None:
    """Run one reconcile, then write the status changes and post the Events."""
    # The timer and the change handlers of one object must not interleave: a
    # resync that read the spec before an update could write the old spec after
    # the update handler wrote the new one. (kopf's memo is per object here.)
    lock = memo.get("reconcile_lock")
    if lock is None:
        lock = memo["reconcile_lock"] = asyncio.Lock()
    async with lock:
        await _reconcile(body, patch, memo, logger, trigger)


async def _reconcile(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any, trigger: str
) -> None:
    started = time.monotonic()
    try:
        outcome = await rc.reconcile(body, memo["kube"], memo["config"])
    except Exception:
        metrics.RECONCILES.labels(trigger, "error").inc()
        raise
    finally:
        metrics.RECONCILE_SECONDS.labels(trigger).observe(time.monotonic() - started)
    for key, value in st.changes(body.get("status") or {}, outcome.status).items():
        patch.status[key] = value
    for write in outcome.writes:
        metrics.CHILD_WRITES.labels(write.kind, write.action.value).inc()
    for kind, reason, message in outcome.events:
        kopf.event(body, type=kind, reason=reason, message=message)
    if outcome.invalid is not None:
        logger.warning(f"not reconciled: {outcome.invalid}")
    metrics.RECONCILES.labels(trigger, "invalid" if outcome.invalid else "ok").inc()


async def cleanup(memo: kopf.Memo) -> None:
    """Close our connection pool on shutdown."""
    kube = memo.get("kube")
    if kube is not None:
        await kube.close()
