"""What the user gets wrong (a path, an architecture, a length, a broken
checkpoint) fails at load time with an error that names the culprit."""

import json
import re

import pytest
import torch
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.model_loader.loader import load_model
from pagoda.runtime.model_loader.resolve import resolve_model_config
from pagoda.runtime.sampling_params import InvalidRequestError
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, MistralConfig

SHAPE = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=64,
    max_position_embeddings=128,
)


def resolve(folder, **kwargs):
    return resolve_model_config(
        EngineArgs(model=str(folder), dtype="float32", device="cpu", **kwargs)
    )


def test_unknown_model_path_names_the_model_field(tmp_path):
    with pytest.raises(InvalidRequestError) as err:
        resolve(tmp_path / "no-such-model")
    assert err.value.param == "model"
    assert "no-such-model" in str(err.value)


def test_folder_without_config_json_names_the_model_field(tmp_path):
    with pytest.raises(InvalidRequestError) as err:
        resolve(tmp_path)
    assert err.value.param == "model"


def test_unsupported_architecture_names_the_architectures_field(tmp_path):
    config = {**SHAPE, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidRequestError) as err:
        resolve(tmp_path)
    assert err.value.param == "architectures"
    assert "GPT2LMHeadModel" in str(err.value)


def test_max_model_len_above_max_position_embeddings_names_the_field(tmp_path, tiny_checkpoint):
    tiny_checkpoint(tmp_path, LlamaConfig(**SHAPE))
    assert resolve(tmp_path).max_model_len == 128
    assert resolve(tmp_path, max_model_len=100).max_model_len == 100
    with pytest.raises(InvalidRequestError) as err:
        resolve(tmp_path, max_model_len=129)
    assert err.value.param == "max_model_len"


def test_sliding_window_caps_max_model_len(tmp_path, tiny_checkpoint):
    # Pagoda attends to the whole context, which equals windowed attention
    # only while the context fits the window.
    tiny_checkpoint(tmp_path, MistralConfig(**SHAPE, sliding_window=32))
    assert resolve(tmp_path).max_model_len == 32
    with pytest.raises(InvalidRequestError) as err:
        resolve(tmp_path, max_model_len=33)
    assert err.value.param == "max_model_len"
    assert "sliding_window" in str(err.value)


@pytest.mark.parametrize(
    "dropped",
    [
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
        # One part of a fused parameter: q and v still fill qkv_proj.
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
    ],
)
def test_checkpoint_missing_a_tensor_names_it(tmp_path, tiny_checkpoint, dropped):
    tiny_checkpoint(tmp_path, LlamaConfig(**SHAPE))
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    del tensors[dropped]
    save_file(tensors, path, metadata={"format": "pt"})
    cfg = resolve(tmp_path)
    with pytest.raises(ValueError, match=re.escape(dropped)):
        load_model(cfg)


def test_checkpoint_tensor_of_wrong_shape_is_rejected(tmp_path, tiny_checkpoint):
    tiny_checkpoint(tmp_path, LlamaConfig(**SHAPE))
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.0.self_attn.v_proj.weight"] = torch.zeros(8, 32)
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="shape mismatch"):
        load_model(resolve(tmp_path))


def test_checkpoint_tensor_the_model_lacks_is_named(tmp_path, tiny_checkpoint):
    tiny_checkpoint(tmp_path, LlamaConfig(**SHAPE))
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.0.mlp.gate_proj.bias"] = torch.zeros(48)
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(KeyError, match=r"gate_up_proj\.bias"):
        load_model(resolve(tmp_path))
