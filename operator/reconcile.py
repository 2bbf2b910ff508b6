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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pagoda.operator import status as st
from pagoda.operator.adapters import Health as AdaptersHealth
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
from pagoda.operator.model_download import REFRESH_SECONDS, Progress, downloading
from pagoda.operator.ownership import conflict, owned_by
from pagoda.operator.render import render_children
from pagoda.operator.render.configmap import stable_adapters_configmap
from pagoda.operator.render.deployment import TEMPLATE_HASH_ANNOTATION
from pagoda.operator.render.labels import (
    adapters_configmap_name,
    admin_secret_name,
    selector_labels,
    selector_string,
    service_name,
)
from pagoda.operator.render.model_download import downloads_model
from pagoda.operator.render.secret import admin_key_of, new_admin_key
from pagoda.operator.render.service import endpoint
from pagoda.operator.triggers import SERVICE_NAME_LABEL

# Reads the downloading pods' GET /progress (model_download.ProgressReader).
ProgressRead = Callable[[Sequence[Mapping[str, Any]]], Awaitable[Mapping[str, Progress]]]


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
    # Reconcile again this soon without waiting for an event (a download's progress).
    requeue_after: float | None = None


async def check_references(api: KubeApi, llms: LLMService) -> list[st.Problem]:
    """Refuse to roll out pods that could never start: missing Secrets and claims.

    Where the operator may not read Secrets (a chart without that grant), the
    Secret check is skipped, and a missing Secret shows up as the pods'
    CreateContainerConfigError instead. Returns the
    faults that do not stop the rollout (`claim_problems`).
    """
    ns, spec = llms.namespace, llms.spec
    if spec.api_key_secret_ref is not None:
        await _check_secret(api, ns, spec.api_key_secret_ref.name, spec.api_key_secret_ref.key)
    if spec.hf_token_secret_ref is not None:
        ref = spec.hf_token_secret_ref
        await _check_secret(api, ns, ref.name, ref.key, "spec.hfTokenSecretRef")
    claims = []
    if spec.model.startswith("pvc://"):
        claims.append(("spec.model", spec.model.removeprefix("pvc://").partition("/")[0]))
    if spec.model_cache is not None and spec.model_cache.claim_name:
        claims.append(("spec.modelCache.claimName", spec.model_cache.claim_name))
    problems = []
    for path, claim in claims:
        found = await api.get("PersistentVolumeClaim", ns, claim)
        if found is None:
            raise MissingReference(
                path, f"PersistentVolumeClaim {claim!r} not found in namespace {ns!r}"
            )
        problems += claim_problems(llms, path, found)
    return problems


# Access modes that attach a volume to one node (or one pod) at a time.
SINGLE_NODE_MODES = {"ReadWriteOnce", "ReadWriteOncePod"}


def most_replicas(llms: LLMService) -> int:
    """The most pods this spec may run at once: the autoscaler's bound, or replicas."""
    auto = llms.spec.autoscaling
    if auto is not None and auto.enabled:
        return max(auto.max_replicas, llms.spec.replicas)
    return llms.spec.replicas


def claim_problems(llms: LLMService, path: str, claim: Mapping[str, Any]) -> list[st.Problem]:
    """A claim that several replicas cannot all mount (pure).

    A ReadWriteOnce volume attaches to one node: pods scheduled elsewhere wait
    in ContainerCreating on a Multi-Attach error, a state that never shows as
    failing. ReadWriteOncePod admits one pod in the whole cluster.
    """
    modes = set((claim.get("spec") or {}).get("accessModes") or [])
    replicas = most_replicas(llms)
    if replicas <= 1 or not modes or not modes <= SINGLE_NODE_MODES:
        return []
    name = (claim.get("metadata") or {}).get("name", "?")
    where = "one pod" if modes == {"ReadWriteOncePod"} else "the pods of one node"
    return [
        st.Problem(
            "SingleNodeVolume",
            f"{path}: PersistentVolumeClaim {name!r} is {', '.join(sorted(modes))}: only "
            f"{where} can mount it, and up to {replicas} replicas may run; the others wait "
            "in ContainerCreating (Multi-Attach). Use a ReadOnlyMany or ReadWriteMany claim",
        )
    ]


async def _check_secret(
    api: KubeApi, namespace: str, name: str, key: str, field: str = "spec.apiKeySecretRef"
) -> None:
    try:
        secret = await api.get("Secret", namespace, name)
    except ApiError as e:
        if e.status == 403:
            return  # no right to read Secrets here: the pods will tell
        raise
    if secret is None:
        raise MissingReference(
            f"{field}.name", f"Secret {name!r} not found in namespace {namespace!r}"
        )
    if key not in (secret.get("data") or {}) | (secret.get("stringData") or {}):
        raise MissingReference(f"{field}.key", f"Secret {name!r} has no key {key!r}")


def adapters_condition(
    health: AdaptersHealth | None, llms: LLMService
) -> tuple[bool | None, str, str]:
    """(status, reason, message) of AdaptersReady for this spec's adapter list."""
    if health is None:
        return None, "Pending", "adapters not checked yet"
    current = health.for_spec(llms)
    return current.ready, current.reason, current.message


def last_need(spec: Mapping[str, Any]) -> int:
    """The serving endpoints a spec that failed validation asks for, read leniently."""

    def whole(key: str) -> int:
        value = spec.get(key, 1)
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return value if ok else 1

    return max(1, min(whole("minAvailable"), whole("replicas")))


async def admin_key(api: KubeApi, llms: LLMService) -> str:
    """The key the admin Secret holds, or a new one when there is none yet.

    Only a Secret of this LLMService counts: one of the same name owned by
    someone else is a ChildConflict, and its value is none of ours. The
    key is read here, before rendering, so that the apply writes it back
    unchanged. Reconciles of one LLMService never run concurrently (one sync
    loop per object, one leading operator), so two cannot both make a key.
    """
    live = await api.get("Secret", llms.namespace, admin_secret_name(llms))
    key = admin_key_of(live) if live is not None and owned_by(live, llms.uid) else None
    return key or new_admin_key()


def _refused(error: ApiError) -> st.Problem:
    return st.Problem(condition_reason(error.status), f"the API server refused {error}")


async def reconcile(
    body: Mapping[str, Any],
    api: KubeApi,
    config: OperatorConfig,
    previous: Mapping[str, Any],
    now: datetime.datetime,
    scaling: tuple[bool, str, str] | None = None,
    adapters: AdaptersHealth | None = None,
    progress: ProgressRead | None = None,
    cache: ChildCache | None = None,
    full: bool = True,
) -> Outcome:
    """Bring the children in line with the spec and compute the status.

    `previous` is the status as last written. `progress` reads the download
    progress of an hf:// model's pods (None: not read). `cache` holds the
    children as the watches last saw them; without `full`, a child it shows
    unchanged is not applied again, and the admin Secret, which is not
    watched, is neither read nor applied (the next full pass repairs it).
    Raises ApiError only for transient errors (the caller retries with
    backoff).
    """
    reads = Reads(api, cache)
    try:
        llms = parse(body, config)
        warnings = await check_references(api, llms)
    except InvalidSpec as problem:
        meta = body.get("metadata") or {}
        # The pods of the last spec that applied still serve: count them. The
        # Service shares the LLMService's name (render.labels.service_name).
        slices = await reads.list(
            "EndpointSlice", meta.get("namespace", ""), {SERVICE_NAME_LABEL: meta.get("name", "")}
        )
        status = st.invalid(
            problem,
            meta.get("generation"),
            previous,
            now,
            serving=st.serving_endpoints(slices),
            need=last_need(body.get("spec") or {}),
        )
        return Outcome(status, invalid=problem)

    writes: list[Write] = []
    problems: list[st.Problem] = []
    try:
        key: str | None = await admin_key(api, llms) if full or cache is None else None
    except ApiError as e:
        if not e.permanent:
            raise
        # Not readable (no RBAC for Secrets): writing a key blind could
        # replace the one the pods hold, so the Secret is left alone.
        problems.append(_refused(e))
        key = None
    children = render_children(llms, config, key)
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
                # Someone else's Service: its endpoints are not this service's.
                problems.append(
                    st.Problem("ChildConflict", taken.message(), blocks_serving=kind == "Service")
                )
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

    pods = tuple(await reads.list("Pod", llms.namespace, selector_labels(llms)))
    observed = st.Observed(
        deployment,
        pods=pods,
        endpoint_slices=tuple(
            await reads.list(
                "EndpointSlice", llms.namespace, {SERVICE_NAME_LABEL: service_name(llms)}
            )
        ),
        template_hash=template_hash,
        problems=tuple(problems),
        warnings=tuple(warnings),
        download_progress=await progress(pods) if progress and downloads_model(llms) else None,
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
        adapters=adapters_condition(adapters, llms) if llms.spec.lora_enabled else None,
    )
    requeue = REFRESH_SECONDS if downloads_model(llms) and downloading(pods) else None
    return Outcome(status, writes, ignored_fields=llms.ignored_fields, requeue_after=requeue)
