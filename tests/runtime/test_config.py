import pytest
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
