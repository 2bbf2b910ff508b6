"""Tiny random transformers checkpoints (Llama with RoPE scaling, Qwen2,
Mistral, tied and untied heads, sharded files) load through our Hugging Face
folder loader and give transformers' float32 logits."""

import json

import pytest
import torch
from transformers import LlamaConfig, MistralConfig, Qwen2Config

BLOCK_SIZE = 8
PROMPT_LEN = 40

# Small but not degenerate: GQA (4 query heads per KV head pair), head_dim 16.
SHAPE = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # The prompt runs past it; with head_dim 16 and theta 1e4 the wavelengths
    # (6 to 20,000 tokens) fall in all three bands: kept, smoothed, divided.
    "original_max_position_embeddings": 16,
}

CONFIGS = {
    "llama-llama3-rope": lambda: LlamaConfig(**SHAPE, rope_scaling=LLAMA3_ROPE),
    "llama-linear-rope": lambda: LlamaConfig(
        **SHAPE, rope_scaling={"rope_type": "linear", "factor": 4.0}, rope_theta=500.0
    ),
    "llama-tied": lambda: LlamaConfig(**SHAPE, tie_word_embeddings=True),
    "llama-untied": lambda: LlamaConfig(**SHAPE, tie_word_embeddings=False),
    "qwen2-qkv-bias": lambda: Qwen2Config(**SHAPE, tie_word_embeddings=False),
    "qwen2-tied": lambda: Qwen2Config(**SHAPE, tie_word_embeddings=True),
    "mistral": lambda: MistralConfig(**SHAPE, sliding_window=None),
    # A window the prompt fits in: windowed and full attention agree.
    "mistral-window": lambda: MistralConfig(**SHAPE, sliding_window=PROMPT_LEN + 8),
}


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    scale = ref.abs().max().item()
    diff = (ours - ref).abs().max().item()
    assert diff <= 1e-4 * scale, f"max |diff| {diff:.3g} at logit scale {scale:.3g}"


def prompt(vocab_size: int) -> list[int]:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(vocab_size, (PROMPT_LEN,), generator=gen).tolist()


def check_against_transformers(folder, hf_model, pagoda_model, kv_cache_binder, model_step):
    ids = prompt(hf_model.config.vocab_size)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
    ours = pagoda_model(model=str(folder))
    blocks = [6, 1, 4, 0, 3, 5]
    kv_cache_binder(ours, 7, BLOCK_SIZE)
    # Whole prompt in one step, then again as two chunks split mid-block
    # into a fresh cache.
    assert_logits_close(model_step(ours, ids, [(0, PROMPT_LEN, blocks)], BLOCK_SIZE), ref)
    kv_cache_binder(ours, 7, BLOCK_SIZE)
    cut = 19
    first = model_step(ours, ids[:cut], [(0, cut, blocks)], BLOCK_SIZE)
    rest = model_step(ours, ids[cut:], [(cut, PROMPT_LEN - cut, blocks)], BLOCK_SIZE)
    assert_logits_close(torch.cat([first, rest]), ref)
    return ours


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tiny_checkpoint_logits_match_transformers(
    name, tmp_path, tiny_checkpoint, pagoda_model, kv_cache_binder, model_step
):
    hf_model = tiny_checkpoint(tmp_path, CONFIGS[name]())
    ours = check_against_transformers(tmp_path, hf_model, pagoda_model, kv_cache_binder, model_step)
    tied = hf_model.config.tie_word_embeddings
    assert ours.config.tie_word_embeddings == tied
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tied


def test_llama3_rope_scaling_is_read_and_applied(tmp_path, tiny_checkpoint, pagoda_model):
    tiny_checkpoint(tmp_path, CONFIGS["llama-llama3-rope"]())
    ours = pagoda_model(model=str(tmp_path))
    scaling = ours.config.rope_scaling
    assert scaling["rope_type"] == "llama3"
    for key in (
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ):
        assert scaling[key] == LLAMA3_ROPE[key]


def test_qwen2_loads_qkv_bias(tmp_path, tiny_checkpoint, pagoda_model):
    hf_model = tiny_checkpoint(tmp_path, CONFIGS["qwen2-qkv-bias"]())
    ours = pagoda_model(model=str(tmp_path))
    hf_attn = hf_model.model.layers[1].self_attn
    bias = ours.model.layers[1].self_attn.qkv_proj.bias
    expected = torch.cat([hf_attn.q_proj.bias, hf_attn.k_proj.bias, hf_attn.v_proj.bias])
    torch.testing.assert_close(bias, expected, rtol=0, atol=0)


def test_sharded_checkpoint_with_index_loads_every_shard(
    tmp_path, tiny_checkpoint, pagoda_model, kv_cache_binder, model_step
):
    hf_model = tiny_checkpoint(tmp_path, CONFIGS["llama-untied"](), max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) >= 3, files
    assert {p.name for p in tmp_path.glob("*.safetensors")} == files
    check_against_transformers(tmp_path, hf_model, pagoda_model, kv_cache_binder, model_step)


def test_hf_overrides_shrink_a_checkpoint_to_its_first_layers(
    tmp_path, tiny_checkpoint, pagoda_model, kv_cache_binder, model_step
):
    hf_model = tiny_checkpoint(tmp_path, CONFIGS["llama-untied"]())
    ours = pagoda_model(model=str(tmp_path), hf_overrides={"num_hidden_layers": 1})
    assert len(ours.model.layers) == 1
    # transformers' model cut the same way is the reference.
    hf_model.model.layers = hf_model.model.layers[:1]
    hf_model.config.num_hidden_layers = 1
    ids = prompt(hf_model.config.vocab_size)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
    kv_cache_binder(ours, 5, BLOCK_SIZE)
    logits = model_step(ours, ids, [(0, PROMPT_LEN, [4, 2, 0, 3, 1])], BLOCK_SIZE)
    assert_logits_close(logits, ref)


def test_layers_share_one_rotary_cache(tmp_path, tiny_checkpoint, pagoda_model):
    tiny_checkpoint(tmp_path, CONFIGS["llama-llama3-rope"]())
    ours = pagoda_model(model=str(tmp_path))
    caches = {id(layer.self_attn.rotary_emb.cos_sin_cache) for layer in ours.model.layers}
    assert len(caches) == 1
