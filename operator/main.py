"""The kopf handlers of the Pagoda operator: decorators only, the work is elsewhere.

Each LLMService gets one sync loop that reconciles on start, when the
LLMService's spec changes, when one of its children changes (the owned kinds
are watched and each event is mapped to its owner) and, as a safety net,
every `resync_seconds` of the operator's configuration. One with
`spec.autoscaling` (built-in mode) gets a second loop, its autoscaler, started
and stopped as the spec asks for it or not; one with LoRA (`spec.lora` or
`spec.adapters`) gets its adapter loop the same way. The loops are started
from the LLMService's watch events (loops.py), not as kopf daemons, so the
LLMServices carry no finalizer.
Run with `pagoda-operator` (see cli.py) or `kopf run -m pagoda.operator.main`.
"""

from __future__ import annotations

from typing import Any

import kopf
from pagoda.operator import cache, handlers
from pagoda.operator.model import GROUP, PLURAL, VERSION

LLMS = (GROUP, VERSION, PLURAL)

# The kinds an LLMService owns, watched so that repair and status follow a
# change within seconds: kind -> kopf resource. Each watch asks the API server
# for the operator's objects only (`watch_selectors`), so the rest of the
# cluster's pods and ConfigMaps never reach the operator's memory.
CHILDREN: dict[str, tuple[str, ...]] = {
    "Deployment": ("apps", "v1", "deployments"),
    "Service": ("v1", "services"),
    "ConfigMap": ("v1", "configmaps"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    "Pod": ("v1", "pods"),
    "EndpointSlice": ("discovery.k8s.io", "v1", "endpointslices"),
}


@kopf.on.startup()
async def configure(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **indices: Any
) -> None:
    handlers.configure(settings, memo)
    handlers.watch_selectors(settings, CHILDREN.values())
    memo["children"] = cache.ChildCache.from_indices(indices, CHILDREN)
    await handlers.detect_cluster(memo, logger)


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    return handlers.login(memo)


@kopf.on.event(*LLMS, id="loops")
async def loops(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    # Async: the loops' tasks must start in kopf's event loop.
    handlers.run_loops(type, body, memo)


@kopf.on.event(*LLMS, id="spec-changed")
def spec_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    handlers.llmservice_changed(body, memo)


def _wake_owner(kind: str) -> Any:
    def wake_owner(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        handlers.child_changed(kind, body, memo)

    return wake_owner


for _kind, _resource in CHILDREN.items():
    # kopf updates the indices before it runs the handlers of the same event,
    # so the loop an event wakes reads a cache that already holds it.
    kopf.index(*_resource, id=cache.index_id(_kind))(cache.index_entry)
    kopf.on.event(*_resource, id=f"wake-owner-of-{_kind}")(_wake_owner(_kind))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await handlers.cleanup(memo)
