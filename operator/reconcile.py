"""One reconcile of one LLMService: validate, render, apply, observe.

The LLMService's sync loop runs this same function on start, on every watch
event of the LLMService or its children, and on every resync (the poolboy
`manage()` shape), so there is one code path to trust. It applies every child
with server-side apply and lets the API server decide what changes: on an
unchanged spec and an undisturbed cluster no object changes and nothing is
reported. A child whose name is taken by an object this LLMService does not
own is never touched (`ownership`). A write the API server refuses for good
(4xx) becomes a condition; one it may accept later raises `ApiError` for the
loop to retry with backoff.

Reads come from the watch-fed cache where it has them (`cache.Reads`), and a
pass woken by a watch event skips the apply of a child the cache shows
unchanged (`ChildCache.unchanged`): a pod event then costs no request at all
but the status write. A full pass (start, resync, retry) applies every child.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pagoda.operator import status as st
from pagoda.operator.api import KubeApi
from pagoda.operator.cache import ChildCache, Reads
from pagoda.operator.config import OperatorConfig
from pagoda.operator.drift import Action, classify, stamp
from pagoda.operator.errors import ApiError, condition_reason
from pagoda.operator.llmservice import (
    InvalidSpec,
    LLMService,
    MissingReference,
    builtin_autoscaling,
    parse,
)
from pagoda.operator.ownership import conflict, owned_by
from pagoda.operator.render import render_children
from pagoda.operator.render.configmap import stable_adapters_configmap
from pagoda.operator.render.deployment import TEMPLATE_HASH_ANNOTATION
from pagoda.operator.render.labels import (
    adapters_configmap_name,
    selector_labels,
    selector_string,
    service_name,
)
from pagoda.operator.render.service import endpoint
from pagoda.operator.triggers import SERVICE_NAME_LABEL


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
    invalid: InvalidSpec | None = None
    ignored_fields: tuple[str, ...] = ()


async def check_references(api: KubeApi, llms: LLMService) -> None:
    """Refuse to roll out pods that could never start: missing Secrets and claims.

    The Secret check runs only where the operator may read Secrets (a Role in
    namespaced mode); cluster-wide it has no such right, and a missing Secret
    shows up as the pods' CreateContainerConfigError instead.
    """
    ns, spec = llms.namespace, llms.spec
    if spec.api_key_secret_ref is not None:
        await _check_secret(api, ns, spec.api_key_secret_ref.name, spec.api_key_secret_ref.key)
    claims = []
    if spec.model.startswith("pvc://"):
        claims.append(("spec.model", spec.model.removeprefix("pvc://").partition("/")[0]))
    if spec.model_cache is not None:
        claims.append(("spec.modelCache.claimName", spec.model_cache.claim_name))
    for path, claim in claims:
        if await api.get("PersistentVolumeClaim", ns, claim) is None:
            raise MissingReference(
                path, f"PersistentVolumeClaim {claim!r} not found in namespace {ns!r}"
            )


async def _check_secret(api: KubeApi, namespace: str, name: str, key: str) -> None:
    try:
        secret = await api.get("Secret", namespace, name)
    except ApiError as e:
        if e.status == 403:
            return  # no right to read Secrets here: the pods will tell
        raise
    if secret is None:
        raise MissingReference(
            "spec.apiKeySecretRef.name", f"Secret {name!r} not found in namespace {namespace!r}"
        )
    if key not in (secret.get("data") or {}) | (secret.get("stringData") or {}):
        raise MissingReference("spec.apiKeySecretRef.key", f"Secret {name!r} has no key {key!r}")


def _refused(error: ApiError) -> st.Problem:
    return st.Problem(condition_reason(error.status), f"the API server refused {error}")


async def reconcile(
    body: Mapping[str, Any],
    api: KubeApi,
    config: OperatorConfig,
    previous: Mapping[str, Any],
    now: datetime.datetime,
    scaling: tuple[bool, str, str] | None = None,
    adapters: tuple[bool | None, str, str] | None = None,
    cache: ChildCache | None = None,
    full: bool = True,
) -> Outcome:
    """Bring the children in line with the spec and compute the status.

    `previous` is the status as last written. `cache` holds the children as
    the watches last saw them; without `full`, a child it shows unchanged is
    not applied again. Raises ApiError only for transient errors (the caller
    retries with backoff).
    """
    reads = Reads(api, cache)
    try:
        llms = parse(body, config)
        await check_references(api, llms)
    except InvalidSpec as problem:
        generation = (body.get("metadata") or {}).get("generation")
        return Outcome(st.invalid(problem, generation, previous, now), invalid=problem)

    children = render_children(llms, config)
    writes: list[Write] = []
    problems: list[st.Problem] = []
    deployment: dict[str, Any] | None = None
    template_hash: str | None = None
    if cache is not None and full:
        cache.forget_gone(time.monotonic())
    for desired in children.present:
        kind, name = desired["kind"], desired["metadata"]["name"]
        try:
            live = await reads.get(kind, llms.namespace, name)
            taken = conflict(kind, live, llms.uid)
            if taken is not None:
                problems.append(st.Problem("ChildConflict", taken.message()))
                continue
            if kind == "ConfigMap" and name == adapters_configmap_name(llms):
                desired = stable_adapters_configmap(desired, live)
            if not full and cache is not None and cache.unchanged(desired, live):
                applied = live
                assert applied is not None
            else:
                applied = await api.apply(stamp(desired), config.field_manager)
                if cache is not None:
                    live = cache.before(desired, live)
                    cache.remember(kind, applied)
        except ApiError as e:
            if not e.permanent:
                raise
            problems.append(_refused(e))
            continue
        plan = classify(desired, live, applied)
        if plan.action is not Action.NONE:
            writes.append(Write(plan.action, kind, name, plan.drifted))
        if kind == "Deployment":
            deployment = applied
            template_hash = desired["spec"]["template"]["metadata"]["annotations"][
                TEMPLATE_HASH_ANNOTATION
            ]
    for ref in children.absent:
        if (
            not full
            and cache is not None
            and not cache.covers(ref.kind)
            and cache.last_applied(ref.kind, ref.namespace, ref.name) is None
        ):
            # A kind the watches do not cache (KEDA's ScaledObject): between
            # full passes, only one this loop made is looked for.
            continue
        try:
            live = await reads.get_owned(ref.kind, ref.namespace, ref.name)
            # Not ours (a user's own PodDisruptionBudget, say): not ours to delete.
            if live is None or not owned_by(live, llms.uid):
                if cache is not None:
                    cache.forget(ref.kind, ref.namespace, ref.name)
                continue
            meta = live["metadata"]
            if await api.delete(
                ref.kind, ref.namespace, ref.name, meta["uid"], meta.get("resourceVersion")
            ):
                writes.append(Write(Action.DELETE, ref.kind, ref.name))
            if cache is not None:
                cache.forget(ref.kind, ref.namespace, ref.name)
        except ApiError as e:
            if not e.permanent:
                raise
            problems.append(_refused(e))

    observed = st.Observed(
        deployment,
        pods=tuple(await reads.list("Pod", llms.namespace, selector_labels(llms))),
        endpoint_slices=tuple(
            await reads.list(
                "EndpointSlice", llms.namespace, {SERVICE_NAME_LABEL: service_name(llms)}
            )
        ),
        template_hash=template_hash,
        problems=tuple(problems),
    )
    status = st.compute(
        llms,
        observed,
        endpoint=endpoint(llms, config),
        selector=selector_string(llms),
        previous=previous,
        now=now,
        unschedulable_grace=config.unschedulable_grace_seconds,
        scaling=scaling if builtin_autoscaling(llms) else None,
        adapters=(adapters or (None, "Pending", "adapters not checked yet"))
        if llms.spec.lora_enabled
        else None,
    )
    return Outcome(status, writes, ignored_fields=llms.ignored_fields)
