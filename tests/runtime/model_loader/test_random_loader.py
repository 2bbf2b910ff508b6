"""Random weights from a preset: the preset's shapes, finite outputs."""

import pytest
import torch
from pagoda.runtime.attention.backend import kv_cache_shape
from pagoda.runtime.attention.torch_backend import TorchAttentionBackend
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.model_loader.loader import load_model
from pagoda.runtime.model_loader.random_loader import PRESETS
from pagoda.runtime.model_loader.resolve import resolve_model_config

pytestmark = pytest.mark.usefixtures("one_thread")


def expected_num_params(p: dict, num_layers: int) -> int:
    """Llama's parameter count from a preset's fields, written out by hand."""
    h, i, v = p["hidden_size"], p["intermediate_size"], p["vocab_size"]
    head_dim = h // p["num_attention_heads"]
    kv = p["num_key_value_heads"] * head_dim
    attention = h * h + 2 * h * kv + h * h  # q, k, v, o
    mlp = 3 * h * i  # gate, up, down
    per_layer = attention + mlp + 2 * h  # two norms
    head = 0 if p.get("tie_word_embeddings") else v * h
    return v * h + num_layers * per_layer + h + head


def test_preset_with_random_weights_has_the_preset_shapes_and_runs(paged_step):
    args = EngineArgs(
        model="smollm2-135m",
        random_weights=True,
        hf_overrides={"num_hidden_layers": 2},
        dtype="float32",
        device="cpu",
    )
    cfg = resolve_model_config(args)
    assert cfg.source == "random" and cfg.tokenizer is None
    assert cfg.max_model_len == PRESETS["smollm2-135m"]["max_position_embeddings"]
    model = load_model(cfg, seed=3)

    preset = PRESETS["smollm2-135m"]
    assert sum(p.numel() for p in model.parameters()) == expected_num_params(preset, 2)
    assert len(model.model.layers) == 2
    assert model.lm_head.weight is model.model.embed_tokens.weight
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), name
        if "norm" in name:
            assert (p == 1).all(), name
        else:
            assert 0.01 < p.std().item() < 0.03, name  # N(0, 0.02)

    a = cfg.arch
    for layer in model.attention_layers():
        layer.backend = TorchAttentionBackend()
        layer.kv_cache = torch.zeros(kv_cache_shape(4, 16, a.num_key_value_heads, a.head_dim))
    metadata, positions = paged_step([(0, 20, [2, 0]), (0, 7, [3])], 16)
    ids = torch.randint(a.vocab_size, (27,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model.compute_logits(model(ids, positions, metadata))
    assert logits.shape == (27, a.vocab_size)
    assert torch.isfinite(logits).all()


def test_random_weights_depend_only_on_the_seed():
    args = EngineArgs(
        model="smollm2-135m",
        random_weights=True,
        hf_overrides={"num_hidden_layers": 1, "vocab_size": 256},
        dtype="float32",
        device="cpu",
    )
    cfg = resolve_model_config(args)
    a, b, c = load_model(cfg, seed=1), load_model(cfg, seed=1), load_model(cfg, seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if "norm" not in name:
            assert not torch.equal(pa, pc), name
