"""The kopf handlers of the Pagoda operator: decorators only, the work is elsewhere.

Each LLMService gets one sync loop (a daemon) that reconciles on start, when
the LLMService's spec changes, when one of its children changes (the owned
kinds are watched and each event is mapped to its owner) and, as a safety
net, every `resync_seconds` of the operator's configuration. One with
`spec.autoscaling` (built-in mode) gets a second daemon, its autoscaler,
which kopf starts and stops as the spec asks for it or not; one with LoRA
(`spec.lora` or `spec.adapters`) gets its adapter loop the same way.
Run with `pagoda-operator` (see cli.py) or `kopf run -m pagoda.operator.main`.
"""

from __future__ import annotations

from typing import Any

import kopf
from pagoda.operator import cache, handlers
from pagoda.operator.model import GROUP, PLURAL, VERSION
from pagoda.operator.render.labels import MANAGED_BY, MANAGED_BY_LABEL
from pagoda.operator.triggers import SERVICE_NAME_LABEL

LLMS = (GROUP, VERSION, PLURAL)

# The kinds an LLMService owns, watched so that repair and status follow a
# change within seconds: kind -> (kopf resource, label filter).
CHILDREN: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "Deployment": (("apps", "v1", "deployments"), {MANAGED_BY_LABEL: MANAGED_BY}),
    "Service": (("v1", "services"), {MANAGED_BY_LABEL: MANAGED_BY}),
    "ConfigMap": (("v1", "configmaps"), {MANAGED_BY_LABEL: MANAGED_BY}),
    "PodDisruptionBudget": (
        ("policy", "v1", "poddisruptionbudgets"),
        {MANAGED_BY_LABEL: MANAGED_BY},
    ),
    "Pod": (("v1", "pods"), {MANAGED_BY_LABEL: MANAGED_BY}),
    "EndpointSlice": (
        ("discovery.k8s.io", "v1", "endpointslices"),
        {SERVICE_NAME_LABEL: kopf.PRESENT},
    ),
}


@kopf.on.startup()
async def configure(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **indices: Any
) -> None:
    handlers.configure(settings, memo)
    memo["children"] = cache.ChildCache.from_indices(indices, CHILDREN)
    await handlers.detect_cluster(memo, logger)


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    return handlers.login(memo)


@kopf.daemon(*LLMS, id="sync", cancellation_timeout=10.0)
async def sync(body: kopf.Body, memo: kopf.Memo, stopped: Any, logger: Any, **_: Any) -> None:
    await handlers.keep_in_sync(body, memo, stopped, logger)


@kopf.daemon(
    *LLMS,
    id="autoscale",
    cancellation_timeout=10.0,
    when=lambda spec, **_: handlers.wants_autoscaler(spec),
)
async def autoscale(body: kopf.Body, memo: kopf.Memo, stopped: Any, logger: Any, **_: Any) -> None:
    await handlers.keep_scaled(body, memo, stopped, logger)


@kopf.daemon(
    *LLMS,
    id="adapters",
    cancellation_timeout=10.0,
    when=lambda spec, **_: handlers.wants_adapters(spec),
)
async def adapters(body: kopf.Body, memo: kopf.Memo, stopped: Any, logger: Any, **_: Any) -> None:
    await handlers.keep_adapters(body, memo, stopped, logger)


@kopf.on.event(*LLMS, id="spec-changed")
def spec_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    handlers.llmservice_changed(body, memo)


def _wake_owner(kind: str) -> Any:
    def wake_owner(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        handlers.child_changed(kind, body, memo)

    return wake_owner


for _kind, (_resource, _labels) in CHILDREN.items():
    # kopf updates the indices before it runs the handlers of the same event,
    # so the loop an event wakes reads a cache that already holds it.
    kopf.index(*_resource, labels=_labels, id=cache.index_id(_kind))(cache.index_entry)
    kopf.on.event(*_resource, labels=_labels, id=f"wake-owner-of-{_kind}")(_wake_owner(_kind))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await handlers.cleanup(memo)
