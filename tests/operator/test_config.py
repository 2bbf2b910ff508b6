"""The operator's own configuration from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from pagoda.operator.config import ConfigError, OperatorConfig, load_profiles, parse_profiles


def test_defaults() -> None:
    config = OperatorConfig.from_env({})
    assert config.gpu_resource == "nvidia.com/gpu" and config.cluster_domain == "cluster.local"
    assert config.resync_seconds == 30 and config.profiles == {}


def test_environment_overrides(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("h100:\n  gpus: 1\n  gpuType: NVIDIA-H100-80GB-HBM3\n  memory: 64Gi\n")
    config = OperatorConfig.from_env(
        {
            "PAGODA_OPERATOR_RUNTIME_IMAGE": "r/img:2",
            "PAGODA_OPERATOR_CLUSTER_DOMAIN": "corp.local",
            "PAGODA_OPERATOR_PROFILES_FILE": str(profiles),
            "PAGODA_OPERATOR_RESYNC_SECONDS": "5",
        }
    )
    assert config.runtime_image == "r/img:2" and config.cluster_domain == "corp.local"
    assert config.profiles["h100"].gpus == 1 and config.resync_seconds == 5


def test_bad_profiles_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        parse_profiles({"x": {"gpus": -1}})
    with pytest.raises(ConfigError):
        parse_profiles({"x": {"profile": "y"}})
    with pytest.raises(ConfigError):
        load_profiles(tmp_path / "absent.yaml")


def test_bad_resync_is_refused() -> None:
    with pytest.raises(ConfigError):
        OperatorConfig.from_env({"PAGODA_OPERATOR_RESYNC_SECONDS": "0"})
    with pytest.raises(ConfigError):
        OperatorConfig.from_env({"PAGODA_OPERATOR_RESYNC_SECONDS": "soon"})


def test_leader_election_defaults_are_client_gos() -> None:
    config = OperatorConfig.from_env({})
    assert (config.lease_name, config.lease_namespace) == ("pagoda-operator", "")
    timing = config.lease_timing()
    assert (timing.lease_duration, timing.renew_deadline, timing.retry_period) == (15, 10, 2)


def test_leader_election_from_the_environment() -> None:
    config = OperatorConfig.from_env(
        {
            "PAGODA_OPERATOR_LEASE_NAME": "llm-operator",
            "PAGODA_OPERATOR_LEASE_NAMESPACE": "pagoda-system",
            "PAGODA_OPERATOR_LEASE_DURATION_SECONDS": "30",
            "PAGODA_OPERATOR_RENEW_DEADLINE_SECONDS": "20",
            "PAGODA_OPERATOR_RETRY_PERIOD_SECONDS": "4",
        }
    )
    assert (config.lease_name, config.lease_namespace) == ("llm-operator", "pagoda-system")
    assert config.lease_timing().lease_duration == 30


def test_a_renew_deadline_beyond_the_lease_duration_is_refused() -> None:
    # The leader would still act after a standby took over: two operators.
    with pytest.raises(ConfigError, match="leader election"):
        OperatorConfig.from_env({"PAGODA_OPERATOR_RENEW_DEADLINE_SECONDS": "20"})
