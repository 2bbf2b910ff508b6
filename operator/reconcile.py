"""One reconcile of one LLMService: validate, render, apply, observe.

Create, resume, update and the resync timer all run this same function (the
poolboy `manage()` shape), so there is one code path to trust. It is
idempotent: on an unchanged spec and an undisturbed cluster it only reads.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pagoda.operator import status as st
from pagoda.operator.config import OperatorConfig
from pagoda.operator.drift import Action, plan, stamp
from pagoda.operator.kube import Kube, Target, target_of
from pagoda.operator.llmservice import InvalidSpec, LLMService, MissingReference, parse
from pagoda.operator.render import render_children
from pagoda.operator.render.labels import selector_string
from pagoda.operator.render.service import endpoint


@dataclass(frozen=True, slots=True)
class Write:
    """One write the reconcile made to a child."""

    action: Action
    kind: str
    name: str
    drifted: tuple[str, ...] = ()

    def event(self) -> tuple[str, str, str]:
        """The Kubernetes Event that tells the user about this write."""
        what = f"{self.kind} {self.name}"
        if self.action is Action.CREATE:
            return "Normal", "Created", f"{what} created"
        if self.action is Action.UPDATE:
            return "Normal", "Updated", f"{what} updated to the new spec"
        if self.action is Action.REPAIR:
            fields = ", ".join(self.drifted[:5])
            return (
                "Warning",
                "DriftRepaired",
                f"{what} was changed outside the operator ({fields}); restored",
            )
        return "Normal", "Deleted", f"{what} deleted: no longer needed"  # Action.DELETE


@dataclass(slots=True)
class Outcome:
    """What a reconcile did and what the status should now say."""

    status: dict[str, Any]
    writes: list[Write] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    invalid: InvalidSpec | None = None


def now() -> str:
    """RFC 3339 UTC time, seconds precision, as conditions carry it."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


async def check_references(kube: Kube, llms: LLMService) -> None:
    """Refuse to roll out pods that could never start: missing Secrets and claims."""
    ns, spec = llms.namespace, llms.spec
    ref = spec.api_key_secret_ref
    if ref is not None:
        secret = await kube.get(Target("Secret", ns, ref.name))
        if secret is None:
            raise MissingReference(
                "spec.apiKeySecretRef.name", f"Secret {ref.name!r} not found in namespace {ns!r}"
            )
        if ref.key not in (secret.get("data") or {}) | (secret.get("stringData") or {}):
            raise MissingReference(
                "spec.apiKeySecretRef.key", f"Secret {ref.name!r} has no key {ref.key!r}"
            )
    claims = []
    if spec.model.startswith("pvc://"):
        claims.append(("spec.model", spec.model.removeprefix("pvc://").partition("/")[0]))
    if spec.model_cache is not None:
        claims.append(("spec.modelCache.claimName", spec.model_cache.claim_name))
    for path, claim in claims:
        if await kube.get(Target("PersistentVolumeClaim", ns, claim)) is None:
            raise MissingReference(
                path, f"PersistentVolumeClaim {claim!r} not found in namespace {ns!r}"
            )


async def reconcile(body: Mapping[str, Any], kube: Kube, config: OperatorConfig) -> Outcome:
    """Bring the children in line with the spec and compute the status."""
    previous = body.get("status") or {}
    try:
        llms = parse(body, config)
        await check_references(kube, llms)
    except InvalidSpec as problem:
        generation = body.get("metadata", {}).get("generation")
        status = st.invalid(problem, generation, previous, now())
        return Outcome(status, events=st.transitions(previous, status), invalid=problem)

    children = render_children(llms, config)
    writes: list[Write] = []
    deployment: dict[str, Any] | None = None
    for desired in children.present:
        target = target_of(desired)
        live = await kube.get(target)
        decision = plan(desired, live)
        if decision.action is not Action.NONE:
            live = await kube.apply(stamp(desired), config.field_manager)
            writes.append(Write(decision.action, target.kind, target.name or "", decision.drifted))
        if target.kind == "Deployment":
            deployment = live
    for ref in children.absent:
        target = Target(ref.kind, ref.namespace, ref.name)
        if await kube.get(target) is not None and await kube.delete(target):
            writes.append(Write(Action.DELETE, ref.kind, ref.name))

    pods = await kube.list(Target("Pod", llms.namespace), selector_string(llms))
    status = st.compute(
        llms,
        st.Observed(deployment, tuple(pods)),
        endpoint=endpoint(llms, config),
        selector=selector_string(llms),
        previous=previous,
        now=now(),
    )
    events = [w.event() for w in writes] + st.transitions(previous, status)
    return Outcome(status, writes, events)
