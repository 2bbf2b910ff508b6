"""Random weights from a config, for benchmarks at sizes whose weights are not
on the machine: same shapes and FLOPs as the real model, meaningless tokens."""

from __future__ import annotations

import torch
from torch import nn

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


@torch.no_grad()
def init_random_weights(model: nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Fill every parameter in place: norms with ones, the rest N(0, std)."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
            continue
        # Draw on the parameter's own device: an 8B model drawn on the CPU
        # and copied over takes minutes.
        gen = generators.get(param.device)
        if gen is None:
            gen = generators[param.device] = torch.Generator(param.device).manual_seed(seed)
        sample = torch.randn(param.shape, generator=gen, device=param.device, dtype=torch.float32)
        param.copy_(sample.mul_(std).to(param.dtype))
