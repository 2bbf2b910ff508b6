"""The kopf handlers of the Pagoda operator: decorators only, the work is elsewhere.

Create, resume and update run the same idempotent reconcile; a timer re-runs
it to repair drift and refresh the status from the Deployment and its pods.
Run with `pagoda-operator` (see cli.py) or `kopf run -m pagoda.operator.main`.
"""

from __future__ import annotations

from typing import Any

import kopf
from pagoda.operator import handlers
from pagoda.operator.config import resync_seconds_from_env
from pagoda.operator.model import GROUP, PLURAL, VERSION

LLMS = (GROUP, VERSION, PLURAL)
RESYNC_SECONDS = resync_seconds_from_env()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    handlers.configure(settings, memo)


@kopf.on.login()
async def login(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    return await handlers.login(settings, memo)


@kopf.on.resume(*LLMS)
@kopf.on.create(*LLMS)
@kopf.on.update(*LLMS)
async def reconcile(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any, reason: str, **_: Any
) -> None:
    await handlers.reconcile(body, patch, memo, logger, trigger=str(reason))


@kopf.timer(*LLMS, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
async def resync(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any, **_: Any
) -> None:
    await handlers.reconcile(body, patch, memo, logger, trigger="resync")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await handlers.cleanup(memo)
