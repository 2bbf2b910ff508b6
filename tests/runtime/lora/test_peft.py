"""Reading PEFT adapter folders: shapes, scaling (alpha/r, rsLoRA, patterns),
and a clear refusal, naming the problem, for every folder that cannot be served."""

import json

import pytest
import torch
from pagoda.runtime.lora.peft import AdapterError, load_peft_adapter
from pagoda.runtime.models.arch_config import ModelArchConfig
from safetensors.torch import save_file

ARCH = ModelArchConfig.from_hf_dict(
    {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 32,
    }
)
PREFIX = "base_model.model.model.layers"


def write_adapter(folder, tensors=None, **config):
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], **config}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    if tensors is None:
        tensors = {
            f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": torch.ones(4, 16),
            f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": torch.ones(16, 4),
        }
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def test_weights_are_read_and_b_carries_the_alpha_over_r_scale(tmp_path):
    adapter = load_peft_adapter(write_adapter(tmp_path / "a"), ARCH, max_rank=8)
    a, b = adapter.weights[(0, "q_proj")]
    assert adapter.rank == 4 and adapter.target_modules == {"q_proj"}
    assert torch.equal(a, torch.ones(4, 16))
    assert torch.equal(b, torch.full((16, 4), 2.0))  # alpha 8 / r 4


def test_rslora_scales_by_the_square_root_of_the_rank(tmp_path):
    adapter = load_peft_adapter(write_adapter(tmp_path / "a", use_rslora=True), ARCH, 8)
    _, b = adapter.weights[(0, "q_proj")]
    assert b[0, 0].item() == pytest.approx(8 / 2)  # alpha / sqrt(4)


def test_alpha_pattern_overrides_the_alpha_of_matching_modules(tmp_path):
    folder = write_adapter(tmp_path / "a", alpha_pattern={"q_proj": 4})
    _, b = load_peft_adapter(folder, ARCH, 8).weights[(0, "q_proj")]
    assert b[0, 0].item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("config", "tensors", "message"),
    [
        ({"r": 16}, None, "exceeds --max-lora-rank 8"),
        ({"use_dora": True}, None, "DoRA"),
        ({"modules_to_save": ["lm_head"]}, None, "modules_to_save"),
        ({"bias": "all"}, None, "bias"),
        ({"peft_type": "IA3"}, None, "not LoRA"),
        (
            {},
            {
                f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": torch.ones(4, 32),
                f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": torch.ones(16, 4),
            },
            "trained for another model",
        ),
        ({}, {f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": torch.ones(4, 16)}, "not both"),
        (
            {},
            {
                "base_model.model.lm_head.lora_A.weight": torch.ones(4, 16),
                "base_model.model.lm_head.lora_B.weight": torch.ones(32, 4),
            },
            "cannot adapt",
        ),
        (
            {},
            {
                f"{PREFIX}.5.self_attn.q_proj.lora_A.weight": torch.ones(4, 16),
                f"{PREFIX}.5.self_attn.q_proj.lora_B.weight": torch.ones(16, 4),
            },
            "2 layers",
        ),
    ],
    ids=[
        "rank-too-high",
        "dora",
        "modules-to-save",
        "bias",
        "not-lora",
        "hidden-size-mismatch",
        "half-a-pair",
        "lm-head",
        "layer-out-of-range",
    ],
)
def test_unservable_adapters_are_refused_naming_why(tmp_path, config, tensors, message):
    folder = write_adapter(tmp_path / "a", tensors, **config)
    with pytest.raises(AdapterError, match=message) as err:
        load_peft_adapter(folder, ARCH, max_rank=8)
    assert err.value.param == "lora_path"


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda f: None, "not a folder"),
        (lambda f: f.mkdir(), "no adapter_config.json"),
        (lambda f: (f.mkdir(), (f / "adapter_config.json").write_text("{oops")), "not valid JSON"),
        (
            lambda f: (f.mkdir(), (f / "adapter_config.json").write_text('{"r": 4}')),
            "neither adapter_model.safetensors nor adapter_model.bin",
        ),
        (
            lambda f: (
                f.mkdir(),
                (f / "adapter_config.json").write_text('{"r": 4}'),
                (f / "adapter_model.safetensors").write_bytes(b"not safetensors"),
            ),
            "cannot read the adapter weights",
        ),
    ],
    ids=["missing", "no-config", "bad-json", "no-weights", "corrupt-weights"],
)
def test_broken_folders_are_refused_naming_why(tmp_path, setup, message):
    folder = tmp_path / "adapter"
    setup(folder)
    with pytest.raises(AdapterError, match=message):
        load_peft_adapter(folder, ARCH, max_rank=8)
