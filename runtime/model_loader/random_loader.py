"""Random weights from a config, for benchmarks at sizes whose weights are not
on the machine: same shapes and FLOPs as the real model, meaningless tokens."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import torch
from pagoda.runtime.models.arch_config import ModelArchConfig

# Shapes of well-known models, so a benchmark needs no config file.
PRESETS: dict[str, dict] = {
    "llama-3-8b": {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "bos_token_id": 128000,
        "eos_token_id": 128009,
    },
    "llama-3-70b": {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "bos_token_id": 128000,
        "eos_token_id": 128009,
    },
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}


def checkpoint_shapes(arch: ModelArchConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face Llama-family checkpoint of this shape holds."""
    h, inter, hd = arch.hidden_size, arch.intermediate_size, arch.head_dim
    q, kv = arch.num_attention_heads * hd, arch.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, h)}
    for i in range(arch.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (inter, h),
                p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
        if arch.attention_bias:
            for name, size in (("q", q), ("k", kv), ("v", kv)):
                shapes[p + f"self_attn.{name}_proj.bias"] = (size,)
    shapes["model.norm.weight"] = (h,)
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, h)
    return shapes


def iter_random_weights(
    arch: ModelArchConfig, seed: int, device: torch.device, std: float = 0.02
) -> Iterator[tuple[str, torch.Tensor]]:
    """A random checkpoint: norms ones, the rest N(0, std).

    Each whole tensor is drawn from a generator seeded by (seed, its name), so
    the weights depend on the seed alone, not on the tensor-parallel split:
    every rank draws the same tensor and keeps its shard, and TP=2 computes
    what TP=1 computes. Drawn on the model's device: an 8B model drawn on the
    CPU and copied over takes minutes.
    """
    gen = torch.Generator(device)
    for name, shape in checkpoint_shapes(arch).items():
        if "norm" in name:
            yield name, torch.ones(shape, device=device)
            continue
        gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
        sample = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        yield name, sample.mul_(std)
