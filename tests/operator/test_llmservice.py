"""Parsing and validating an LLMService body, profiles included."""

from __future__ import annotations

import pytest
from pagoda.operator.config import OperatorConfig, parse_profiles
from pagoda.operator.llmservice import InvalidSpec, parse, rollout_strategy

PROFILES = parse_profiles(
    {
        "a100x4": {"gpus": 4, "gpuType": "NVIDIA-A100-SXM4-80GB", "memory": "320Gi"},
        "cpu-small": {"cpu": "2", "memory": "8Gi"},
    }
)
CONFIG = OperatorConfig(profiles=PROFILES)


def body(spec: dict, name: str = "chat") -> dict:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": "u", "generation": 2},
        "spec": spec,
    }


def test_identity_and_defaults() -> None:
    llms = parse(body({"model": "m"}), CONFIG)
    assert (llms.name, llms.namespace, llms.uid, llms.generation) == ("chat", "ml", "u", 2)
    assert llms.served_model_name == "chat"
    assert llms.resources.gpus == 0 and llms.resources.shared_memory == "8Gi"


def test_served_model_name_overrides_the_name() -> None:
    assert (
        parse(body({"model": "m", "servedModelName": "llama3"}), CONFIG).served_model_name
        == "llama3"
    )


def test_profile_resolves_and_is_checked_against_one_gpu_per_rank() -> None:
    llms = parse(body({"model": "m", "resources": {"profile": "cpu-small"}}), CONFIG)
    assert llms.resources.cpu == "2" and llms.resources.memory == "8Gi"
    with pytest.raises(InvalidSpec) as e:
        parse(body({"model": "m", "resources": {"profile": "a100x4"}}), CONFIG)
    assert e.value.field == "spec.resources.gpus"


def test_rollout_defaults_depend_on_the_kind_of_pod() -> None:
    cpu = parse(body({"model": "m", "replicas": 3}), CONFIG)
    gpu = parse(body({"model": "m", "replicas": 3, "resources": {"gpus": 1}}), CONFIG)
    assert rollout_strategy(cpu) == (1, 0)  # surge first, never below capacity
    assert rollout_strategy(gpu) == (0, 1)  # no spare GPU is assumed


def test_a_single_gpu_replica_surges_rather_than_go_down() -> None:
    # Stepping down the only pod is an outage; the surge pod waits for a GPU instead.
    one = parse(body({"model": "m", "replicas": 1, "resources": {"gpus": 1}}), CONFIG)
    assert rollout_strategy(one) == (1, 0)


def test_an_unset_rollout_field_never_makes_both_zero() -> None:
    gpu = parse(
        body(
            {
                "model": "m",
                "replicas": 2,
                "resources": {"gpus": 1},
                "rollout": {"maxUnavailable": 0},
            }
        ),
        CONFIG,
    )
    assert rollout_strategy(gpu) == (1, 0)
    cpu = parse(body({"model": "m", "rollout": {"maxSurge": 0}}), CONFIG)
    assert rollout_strategy(cpu) == (0, 1)
    explicit = parse(body({"model": "m", "rollout": {"maxSurge": "25%"}}), CONFIG)
    assert rollout_strategy(explicit) == ("25%", 0)


def test_unknown_profile_names_the_field_and_the_known_ones() -> None:
    with pytest.raises(InvalidSpec) as e:
        parse(body({"model": "m", "resources": {"profile": "h200"}}), CONFIG)
    assert e.value.field == "spec.resources.profile"
    assert "a100x4, cpu-small" in e.value.message


def test_errors_name_nested_fields() -> None:
    with pytest.raises(InvalidSpec) as e:
        parse(
            body({"model": "m", "scheduling": {"tolerations": [{"effect": "Sometimes"}]}}), CONFIG
        )
    assert e.value.field == "spec.scheduling.tolerations[0].effect"


def test_missing_model_is_named() -> None:
    with pytest.raises(InvalidSpec) as e:
        parse(body({}), CONFIG)
    assert e.value.field == "spec.model"
