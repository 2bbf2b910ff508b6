"""The operator's own configuration: what the chart sets, read once at start-up.

Everything a cluster admin decides (which runtime image, which GPU resource and
node label, which named resource profiles exist) lives here rather than in each
LLMService, so users write only what is specific to their model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pagoda.operator.leader import Timing
from pagoda.operator.model import ResourcesSpec
from pydantic import TypeAdapter, ValidationError

DEFAULT_RUNTIME_IMAGE = "ghcr.io/pagoda-llm/pagoda-runtime:0.1.0"


class ConfigError(ValueError):
    """The operator's configuration (environment or profiles file) is unusable."""


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    """Cluster-wide settings of one operator deployment."""

    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    cluster_domain: str = "cluster.local"
    gpu_resource: str = "nvidia.com/gpu"
    gpu_type_label: str = "nvidia.com/gpu.product"
    # Named compute profiles users refer to with spec.resources.profile.
    profiles: Mapping[str, ResourcesSpec] = field(default_factory=dict)
    # The safety net: each LLMService is reconciled at least this often even if
    # no watch event arrives (watches of the children do the prompt work).
    resync_seconds: float = 30.0
    # After a watch event, wait this long for its siblings (a rollout sends
    # many) so that one reconcile answers them all.
    settle_seconds: float = 0.2
    # A pod may be Unschedulable this long (a cluster autoscaler adding a node)
    # before the LLMService is Degraded.
    unschedulable_grace_seconds: float = 300.0
    # Whether the cluster has the native `sleep` preStop action (Kubernetes
    # 1.30+); detected from the API server's version at start-up.
    sleep_action: bool = True
    field_manager: str = "pagoda-operator"
    # How often the adapter loop checks each ready pod's adapters once they
    # match the spec; while they do not, it checks every second.
    adapter_sync_seconds: float = 10.0
    # Leader election among the operator's replicas: the Lease (its namespace
    # empty: the operator pod's own) and client-go's timing (see leader.py).
    lease_name: str = "pagoda-operator"
    lease_namespace: str = ""
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0

    def __post_init__(self) -> None:
        try:
            self.lease_timing()
        except ValueError as e:
            raise ConfigError(f"leader election: {e}") from e

    def lease_timing(self) -> Timing:
        """The leader election's durations."""
        return Timing(
            lease_duration=self.lease_duration_seconds,
            renew_deadline=self.renew_deadline_seconds,
            retry_period=self.retry_period_seconds,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """Read PAGODA_OPERATOR_* variables (the chart sets them)."""
        env = os.environ if env is None else env
        profiles_file = env.get("PAGODA_OPERATOR_PROFILES_FILE")
        return cls(
            runtime_image=env.get("PAGODA_OPERATOR_RUNTIME_IMAGE", DEFAULT_RUNTIME_IMAGE),
            cluster_domain=env.get("PAGODA_OPERATOR_CLUSTER_DOMAIN", "cluster.local"),
            gpu_resource=env.get("PAGODA_OPERATOR_GPU_RESOURCE", "nvidia.com/gpu"),
            gpu_type_label=env.get("PAGODA_OPERATOR_GPU_TYPE_LABEL", "nvidia.com/gpu.product"),
            profiles=load_profiles(Path(profiles_file)) if profiles_file else {},
            resync_seconds=_positive(env, "PAGODA_OPERATOR_RESYNC_SECONDS", 30.0),
            adapter_sync_seconds=_positive(env, "PAGODA_OPERATOR_ADAPTER_SYNC_SECONDS", 10.0),
            lease_name=env.get("PAGODA_OPERATOR_LEASE_NAME", "pagoda-operator"),
            lease_namespace=env.get("PAGODA_OPERATOR_LEASE_NAMESPACE", ""),
            lease_duration_seconds=_positive(env, "PAGODA_OPERATOR_LEASE_DURATION_SECONDS", 15.0),
            renew_deadline_seconds=_positive(env, "PAGODA_OPERATOR_RENEW_DEADLINE_SECONDS", 10.0),
            retry_period_seconds=_positive(env, "PAGODA_OPERATOR_RETRY_PERIOD_SECONDS", 2.0),
        )


def _positive(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = float(env.get(name, default))
    except ValueError as e:
        raise ConfigError(f"{name}: {e}") from e
    if value <= 0:
        raise ConfigError(f"{name} must be positive")
    return value


_PROFILES = TypeAdapter(dict[str, ResourcesSpec])


def parse_profiles(data: object) -> dict[str, ResourcesSpec]:
    """Validate a `{name: resources}` mapping; a profile cannot name another profile."""
    try:
        profiles = _PROFILES.validate_python(data or {})
    except ValidationError as e:
        raise ConfigError(f"resource profiles: {e}") from e
    for name, profile in profiles.items():
        if profile.profile:
            raise ConfigError(f"resource profile {name!r} must not refer to another profile")
    return profiles


def load_profiles(path: Path) -> dict[str, ResourcesSpec]:
    """Read the profiles file the chart mounts from its ConfigMap."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"resource profiles file {path}: {e}") from e
    return parse_profiles(data)
