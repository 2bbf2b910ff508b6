"""Write a random PEFT LoRA adapter for a model's architecture.

For tests, benchmarks and demos where no trained adapter can be downloaded:
rank `r` on all seven projections, A scaled like a default init and B
nonzero (a PEFT default init has B = 0, which changes nothing), so each seed
gives an adapter whose outputs differ from the base model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pagoda.runtime.lora.peft import SUPPORTED_MODULES, module_shapes
from pagoda.runtime.models.arch_config import ModelArchConfig

_MLP = ("gate_proj", "up_proj", "down_proj")


def write_random_adapter(
    folder: str | Path, arch: ModelArchConfig, rank: int = 8, seed: int = 0, scale: float = 0.02
) -> Path:
    """Save `adapter_config.json` and `adapter_model.safetensors` into `folder`."""
    from safetensors.torch import save_file

    shapes = module_shapes(arch)  # (in, out) of each projection
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(arch.num_hidden_layers):
        for name, (fin, fout) in shapes.items():
            part = "mlp" if name in _MLP else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fin, generator=gen) / fin**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fout, rank, generator=gen) * scale
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(SUPPORTED_MODULES),
        "bias": "none",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder
