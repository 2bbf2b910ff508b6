import pytest
import torch
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.sampling_params import InvalidRequestError


@pytest.mark.parametrize(("device_type", "budget"), [("cpu", 2048), ("cuda", 4096)])
def test_the_step_budget_defaults_by_device(device_type: str, budget: int) -> None:
    config = EngineArgs().scheduler_config(max_model_len=8192, device_type=device_type)
    assert config.max_num_batched_tokens == budget


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_a_given_step_budget_is_kept_on_every_device(device_type: str) -> None:
    args = EngineArgs(max_num_batched_tokens=640)
    assert args.scheduler_config(8192, device_type).max_num_batched_tokens == 640


def test_the_engine_config_on_the_cpu_takes_the_cpu_budget() -> None:
    args = EngineArgs(model="smollm2-135m", random_weights=True, device="cpu", dtype="float32")
    config = args.create_engine_config()
    assert config.model_config.device.type == "cpu"
    assert config.scheduler_config.max_num_batched_tokens == 2048


@pytest.mark.parametrize("budget", [0, -1])
def test_a_step_budget_below_one_is_refused(budget: int) -> None:
    with pytest.raises(InvalidRequestError) as e:
        EngineArgs(max_num_batched_tokens=budget).validate()
    assert e.value.param == "max_num_batched_tokens"


@pytest.mark.parametrize(
    ("kv_cache_dtype", "model_dtype", "expected"),
    [
        ("auto", torch.float32, torch.float32),
        ("auto", torch.bfloat16, torch.bfloat16),
        ("float16", torch.float32, torch.float16),
        ("bfloat16", torch.float32, torch.bfloat16),
        ("float32", torch.bfloat16, torch.float32),
    ],
)
def test_the_kv_cache_dtype_is_the_models_unless_named(
    kv_cache_dtype: str, model_dtype: torch.dtype, expected: torch.dtype
) -> None:
    cache = EngineArgs(kv_cache_dtype=kv_cache_dtype).cache_config()
    assert cache.kv_cache_dtype(model_dtype) == expected


@pytest.mark.parametrize("bad", ["fp8", "half", "int8", "", "Float16"])
def test_an_unknown_kv_cache_dtype_is_refused_by_name(bad: str) -> None:
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype must be one of") as e:
        EngineArgs(kv_cache_dtype=bad).validate()
    assert e.value.param == "kv_cache_dtype"


def test_the_kv_cache_dtype_is_a_flag_and_a_variable(monkeypatch) -> None:
    import argparse

    from pagoda.runtime.entrypoints.cli_args import add_engine_args, engine_args_from

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_args_from(parser.parse_args([])).kv_cache_dtype == "auto"
    args = engine_args_from(parser.parse_args(["--kv-cache-dtype", "float16"]))
    assert args.kv_cache_dtype == "float16"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp8"])
    monkeypatch.setenv("PAGODA_KV_CACHE_DTYPE", "bfloat16")
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_args_from(parser.parse_args([])).kv_cache_dtype == "bfloat16"
