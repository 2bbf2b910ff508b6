"""One LLMService, parsed and validated: the input of every renderer.

`parse()` runs before any logic touches the cluster. It turns the raw body into
typed values, resolves a resource profile, and re-checks the rules that the
schema only enforces at admission (an object stored before a rule existed, or a
profile whose GPU count does not fit the tensor-parallel size). Failures carry
the path of the offending field, so conditions and Events can name it. Fields
this operator does not know (a newer CRD's) are ignored and listed, not fatal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.operator.config import OperatorConfig
from pagoda.operator.model import (
    NAME_MAX,
    NAME_PATTERN,
    LLMServiceSpec,
    ResourcesSpec,
    RuleError,
    check_gpus,
    unknown_fields,
)
from pydantic import ValidationError


class InvalidSpec(ValueError):
    """The spec cannot be served as written; `field` is its path, e.g. `spec.engine.dtype`."""

    reason = "InvalidSpec"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class MissingReference(InvalidSpec):
    """The spec names a Secret or PersistentVolumeClaim that does not exist (yet)."""

    reason = "MissingReference"


@dataclass(frozen=True, slots=True)
class Resources:
    """Compute for one pod after the profile and the explicit fields are merged."""

    gpus: int = 0
    allow_unused_gpus: bool = False
    gpu_type: str | None = None
    cpu: str | None = None
    memory: str | None = None
    shared_memory: str = "8Gi"


@dataclass(frozen=True, slots=True)
class LLMService:
    """A validated LLMService: identity, spec and resolved compute."""

    name: str
    namespace: str
    uid: str | None
    generation: int | None
    spec: LLMServiceSpec
    resources: Resources
    # Spec fields this operator does not know (written for a newer CRD); ignored.
    ignored_fields: tuple[str, ...] = ()

    @property
    def served_model_name(self) -> str:
        """What clients put in `model`; the object's name unless the spec says otherwise."""
        return self.spec.served_model_name or self.name


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _first_error(e: ValidationError) -> InvalidSpec:
    err = e.errors()[0]
    path = _field_path(tuple(err["loc"]))
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, RuleError):
        # A cross-field rule is raised at its model's location; it names its field.
        return InvalidSpec(path + cause.field_path, str(cause))
    return InvalidSpec(path, str(err["msg"]).removeprefix("Value error, "))


def resolve_resources(spec: LLMServiceSpec, config: OperatorConfig) -> Resources:
    """Merge the named profile (if any) with the spec's explicit resource fields."""
    asked = spec.resources
    base = ResourcesSpec()
    if asked.profile:
        if asked.profile not in config.profiles:
            known = ", ".join(sorted(config.profiles)) or "none are configured"
            raise InvalidSpec(
                "spec.resources.profile", f"unknown profile {asked.profile!r} ({known})"
            )
        base = config.profiles[asked.profile]
    merged = base.model_copy(update=asked.model_dump(exclude_unset=True, exclude={"profile"}))
    resources = Resources(
        gpus=merged.gpus or 0,
        allow_unused_gpus=bool(merged.allow_unused_gpus),
        gpu_type=merged.gpu_type,
        cpu=None if merged.cpu is None else str(merged.cpu),
        memory=None if merged.memory is None else str(merged.memory),
        shared_memory=str(merged.shared_memory or "8Gi"),
    )
    try:
        check_gpus(resources.gpus, spec.tensor_parallel_size, resources.allow_unused_gpus)
    except RuleError as e:
        raise InvalidSpec("spec" + e.field_path, str(e)) from None
    if resources.gpu_type and resources.gpus == 0:
        raise InvalidSpec("spec.resources.gpuType", "gpuType needs gpus > 0")
    return resources


def parse(body: Mapping[str, Any], config: OperatorConfig) -> LLMService:
    """Validate a raw LLMService body; raise InvalidSpec naming the first bad field."""
    meta = body.get("metadata", {})
    name = meta.get("name", "")
    if not re.match(NAME_PATTERN, name) or len(name) > NAME_MAX:
        raise InvalidSpec(
            "metadata.name", f"{name!r} must be a DNS label of at most {NAME_MAX} characters"
        )
    try:
        spec = LLMServiceSpec.model_validate(body.get("spec") or {})
    except ValidationError as e:
        raise _first_error(e) from None
    served = spec.served_model_name or name
    for index, adapter in enumerate(spec.adapters):
        if adapter.name == served:
            # Not expressible in CEL: the default name is metadata.name.
            raise InvalidSpec(
                f"spec.adapters[{index}].name",
                f"{adapter.name!r} is the served model name; clients could not tell them apart",
            )
    return LLMService(
        name=name,
        namespace=meta.get("namespace", ""),
        uid=meta.get("uid"),
        generation=meta.get("generation"),
        spec=spec,
        resources=resolve_resources(spec, config),
        ignored_fields=tuple(unknown_fields(LLMServiceSpec, body.get("spec") or {})),
    )


def rollout_strategy(llms: LLMService) -> tuple[int | str, int | str]:
    """(maxSurge, maxUnavailable): the spec's, or the defaults for this kind of pod.

    The default surges first and never dips (1, 0), so a rollout drops no
    capacity. GPU pods of a service with several replicas step down one pod
    at a time instead (0, 1), since a spare GPU for a surge pod is not
    assumed; a single replica cannot step down without an outage, so it
    surges too, and its new pod waits for a free GPU (Pending) while the old
    one serves. A field left unset never makes both zero: it becomes 1.
    """
    stepped = llms.resources.gpus and llms.spec.replicas > 1
    surge_default, unavailable_default = (0, 1) if stepped else (1, 0)
    asked = llms.spec.rollout
    surge = asked.max_surge if asked.max_surge is not None else surge_default
    unavailable = (
        asked.max_unavailable if asked.max_unavailable is not None else unavailable_default
    )
    if surge in (0, "0%") and unavailable in (0, "0%"):
        if asked.max_surge is None:
            surge = 1
        else:
            unavailable = 1
    return surge, unavailable


def builtin_autoscaling(llms: LLMService) -> bool:
    """Whether the operator's own autoscaler scales this LLMService (not KEDA, not off)."""
    auto = llms.spec.autoscaling
    return auto is not None and auto.enabled and auto.mode == "builtin"


def desired_replicas(llms: LLMService) -> int:
    """The pods to run: `spec.replicas`, within [minReplicas, maxReplicas] while autoscaling is on.

    As HPA does, a count outside the bounds (a GitOps change that lowered
    maxReplicas below the live count, a `kubectl scale` past them) is not an
    error but is brought within them: the autoscaler writes the bounded count
    back, and the pods follow the bounds at once.
    """
    auto = llms.spec.autoscaling
    if auto is None or not auto.enabled:
        return llms.spec.replicas
    return max(auto.min_replicas, min(auto.max_replicas, llms.spec.replicas))
