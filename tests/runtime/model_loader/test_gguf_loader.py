"""GGUF metadata reads into the model's shape, RoPE scaling included."""

import math

import numpy as np
import pytest
import torch
from pagoda.runtime.layers.rotary import rope_inv_freq
from pagoda.runtime.model_loader.gguf_loader import read_gguf_config
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

gguf = pytest.importorskip("gguf")

HEAD_DIM, THETA = 16, 500000.0
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def llama_cpp_rope_factors(inv_freq: torch.Tensor) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py stores as rope_freqs for Llama 3.1."""
    factor, low, high = LLAMA3["factor"], LLAMA3["low_freq_factor"], LLAMA3["high_freq_factor"]
    old = LLAMA3["original_max_position_embeddings"]
    out = []
    for freq in inv_freq.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(path, rope_freqs=None) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_embedding_length(64)
    w.add_block_count(2)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_vocab_size(32)
    w.add_context_length(512)
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_metadata_gives_the_model_shape(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    cfg = read_gguf_config(path)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (64, 96, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 16)
    assert (cfg.vocab_size, cfg.max_position_embeddings) == (32, 512)
    assert cfg.rope_theta == THETA and cfg.rope_scaling is None
    assert cfg.tie_word_embeddings  # no output.weight
    assert cfg.rms_norm_eps == pytest.approx(1e-5)


def test_llama31_gguf_rope_freqs_give_transformers_llama3_frequencies(tmp_path):
    hf = LlamaRotaryEmbedding(
        LlamaConfig(
            hidden_size=64,
            num_attention_heads=4,
            max_position_embeddings=512,
            rope_parameters={**LLAMA3, "rope_theta": THETA},
        )
    )
    base = rope_inv_freq(HEAD_DIM, THETA, None)
    path = tmp_path / "llama31.gguf"
    write_gguf(path, rope_freqs=llama_cpp_rope_factors(base.double()))
    cfg = read_gguf_config(path)
    ours = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    assert not torch.allclose(base, hf.inv_freq)  # the scaling matters here
    torch.testing.assert_close(ours, hf.inv_freq, rtol=1e-6, atol=0)
