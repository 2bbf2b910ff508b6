"""`speculative_config` validation: vLLM's keys, errors that name the field."""

import pytest
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.sampling_params import InvalidRequestError
from pagoda.runtime.spec_decode.config import resolve_speculative_config


@pytest.mark.parametrize(
    ("spec", "param"),
    [
        ({"method": "medusa", "num_speculative_tokens": 3}, "speculative_config.method"),
        (
            {"method": "ngram", "num_speculative_tokens": 0},
            "speculative_config.num_speculative_tokens",
        ),
        ({"method": "ngram", "num_speculative_tokens": 3, "k": 1}, "speculative_config.k"),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_min": 4,
                "prompt_lookup_max": 2,
            },
            "speculative_config.prompt_lookup_min",
        ),
        ({"method": "draft_model", "num_speculative_tokens": 3}, "speculative_config.model"),
    ],
)
def test_bad_configs_name_the_field(spec, param):
    with pytest.raises(InvalidRequestError) as err:
        resolve_speculative_config(spec, EngineArgs(), None)
    assert err.value.param == param


def test_off_when_empty_and_ngram_resolves_with_vllm_defaults():
    assert resolve_speculative_config(None, EngineArgs(), None) is None
    assert resolve_speculative_config({}, EngineArgs(), None) is None
    cfg = resolve_speculative_config(
        {"method": "ngram", "num_speculative_tokens": 3}, EngineArgs(), None
    )
    assert (cfg.prompt_lookup_min, cfg.num_lookahead_tokens) == (2, 0)
    assert "method=ngram, k=3" in cfg.summary()


def test_tensor_parallel_is_refused():
    with pytest.raises(InvalidRequestError, match="tensor_parallel_size"):
        resolve_speculative_config(
            {"method": "ngram", "num_speculative_tokens": 3},
            EngineArgs(tensor_parallel_size=2),
            None,
        )
