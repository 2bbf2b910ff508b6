"""config.json as transformers 4 and 5 write it reads into one ModelArchConfig."""

import pytest
from pagoda.runtime.models.arch_config import ModelArchConfig
from pagoda.runtime.sampling_params import InvalidRequestError

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
}
LLAMA3 = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def test_transformers4_rope_scaling_and_transformers5_rope_parameters_agree():
    v4 = ModelArchConfig.from_hf_dict(
        {**BASE, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3}}
    )
    v5 = ModelArchConfig.from_hf_dict(
        {**BASE, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3}}
    )
    for cfg in (v4, v5):
        assert cfg.rope_theta == 500000.0
        assert cfg.rope_scaling["rope_type"] == "llama3"
        assert {k: cfg.rope_scaling[k] for k in LLAMA3} == LLAMA3


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_scaling": {"type": "linear", "factor": 2.0}},  # the oldest spelling
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    ],
)
def test_linear_rope_scaling_in_every_spelling(rope):
    cfg = ModelArchConfig.from_hf_dict({**BASE, **rope})
    assert cfg.rope_scaling["factor"] == 2.0
    assert cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type")) == "linear"


@pytest.mark.parametrize(
    "rope",
    [
        {},
        {"rope_scaling": None},
        {"rope_scaling": {"rope_type": "default"}},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    ],
)
def test_default_rope_means_no_scaling(rope):
    cfg = ModelArchConfig.from_hf_dict({**BASE, **rope})
    assert cfg.rope_scaling is None
    assert cfg.rope_theta == 10000.0


def test_qwen2_has_qkv_bias_unless_told_otherwise():
    qwen2 = {**BASE, "architectures": ["Qwen2ForCausalLM"]}
    assert ModelArchConfig.from_hf_dict(qwen2).attention_bias
    assert not ModelArchConfig.from_hf_dict({**qwen2, "attention_bias": False}).attention_bias
    assert not ModelArchConfig.from_hf_dict(BASE).attention_bias


def test_head_dim_defaults_to_hidden_over_heads_and_may_be_explicit():
    assert ModelArchConfig.from_hf_dict(BASE).head_dim == 16
    assert ModelArchConfig.from_hf_dict({**BASE, "head_dim": 32}).head_dim == 32


def test_eos_list_keeps_every_id_and_overrides_apply_last():
    cfg = ModelArchConfig.from_hf_dict({**BASE, "eos_token_id": [7, 9]}, {"num_hidden_layers": 1})
    assert cfg.eos_token_ids == (7, 9)
    assert cfg.num_hidden_layers == 1


def test_heads_not_a_multiple_of_kv_heads_names_the_field():
    with pytest.raises(InvalidRequestError) as err:
        ModelArchConfig.from_hf_dict({**BASE, "num_key_value_heads": 3})
    assert err.value.param == "num_key_value_heads"


@pytest.mark.parametrize(
    ("fields", "window"),
    [
        ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096}, 4096),
        ({"architectures": ["MistralForCausalLM"], "sliding_window": None}, None),
        # Qwen2 configs carry a window they do not use unless asked.
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "sliding_window": 32768,
                "use_sliding_window": False,
                "max_window_layers": 1,
            },
            None,
        ),
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "sliding_window": 1024,
                "use_sliding_window": True,
                "max_window_layers": 1,
            },
            1024,
        ),
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "sliding_window": 1024,
                "layer_types": ["full_attention", "full_attention"],
            },
            None,
        ),
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "sliding_window": 1024,
                "layer_types": ["full_attention", "sliding_attention"],
            },
            1024,
        ),
    ],
)
def test_sliding_window_only_where_a_layer_uses_it(fields, window):
    assert ModelArchConfig.from_hf_dict({**BASE, **fields}).sliding_window == window
