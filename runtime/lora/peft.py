"""Read a PEFT LoRA adapter folder and check it against the base model.

A folder holds `adapter_config.json` and `adapter_model.safetensors` (or
`adapter_model.bin`). Each targeted projection `W` gains `B @ A` scaled by
`lora_alpha / r` (or `/ sqrt(r)` with rsLoRA): y = W x + scale * B (A x).
The scale is folded into B once, here. Every refusal is an `AdapterError`
naming what is wrong, so a bad folder is a clear 4xx, never a crash.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from pagoda.runtime.models.arch_config import ModelArchConfig
from pagoda.runtime.sampling_params import InvalidRequestError

# PEFT module name -> (input features, output features) in terms of the model.
SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_WEIGHT_NAME = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)\.lora_([AB])(?:\.[\w-]+)?\.weight$"
)


class AdapterError(InvalidRequestError):
    """The adapter folder cannot be served; the message says why."""

    def __init__(self, message: str):
        super().__init__(message, param="lora_path")


@dataclass
class LoRAAdapter:
    """An adapter's weights, ready to copy into slots: per (layer, module)
    the A [r, in] and the scaled B [out, r], in float32 on the CPU."""

    path: str
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def target_modules(self) -> set[str]:
        return {module for _, module in self.weights}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def module_shapes(arch: ModelArchConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each supported projection of the base model."""
    h, inter, hd = arch.hidden_size, arch.intermediate_size, arch.head_dim
    q, kv = arch.num_attention_heads * hd, arch.num_key_value_heads * hd
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }


def load_peft_adapter(path: str | Path, arch: ModelArchConfig, max_rank: int) -> LoRAAdapter:
    """Read and validate one adapter folder (raises AdapterError)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise AdapterError(f"adapter path {str(path)!r} is not a folder")
    config = _read_config(folder)
    rank = config["r"]
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"adapter_config.json: r must be a positive integer, got {rank!r}")
    ranks = {**{"": rank}, **(config.get("rank_pattern") or {})}
    if max(ranks.values()) > max_rank:
        raise AdapterError(f"adapter rank {max(ranks.values())} exceeds --max-lora-rank {max_rank}")
    tensors = _read_tensors(folder)
    shapes = module_shapes(arch)
    weights: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = _WEIGHT_NAME.search(name)
        if match is None:
            if "lora_" in name or "modules_to_save" in name:
                raise AdapterError(
                    f"adapter weight {name!r} targets a module Pagoda cannot adapt "
                    f"(supported: {', '.join(SUPPORTED_MODULES)})"
                )
            raise AdapterError(f"adapter weight {name!r} is not a LoRA weight")
        layer, module, which = int(match[1]), match[2], match[3]
        if module not in shapes:
            raise AdapterError(
                f"adapter targets {module!r}, which this model does not have "
                f"(supported: {', '.join(SUPPORTED_MODULES)})"
            )
        if layer >= arch.num_hidden_layers:
            raise AdapterError(
                f"adapter weight {name!r} is for layer {layer}, but the model has "
                f"{arch.num_hidden_layers} layers"
            )
        weights.setdefault((layer, module), {})[which] = tensor
    if not weights:
        raise AdapterError("the adapter holds no LoRA weights")
    out: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), pair in weights.items():
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"layer {layer} {module} has lora_A or lora_B but not both")
        a, b = pair["A"].float(), pair["B"].float()
        in_f, out_f = shapes[module]
        r = a.shape[0]
        if a.shape != (r, in_f) or b.shape != (out_f, r):
            raise AdapterError(
                f"layer {layer} {module}: lora_A {tuple(a.shape)} and lora_B "
                f"{tuple(b.shape)} do not fit the base model ({in_f} in, {out_f} out): "
                "the adapter was trained for another model"
            )
        if r > max_rank:
            raise AdapterError(f"adapter rank {r} exceeds --max-lora-rank {max_rank}")
        out[(layer, module)] = (a.contiguous(), (b * _scale(config, module, r)).contiguous())
    return LoRAAdapter(str(folder), max(a.shape[0] for a, _ in out.values()), out)


def _scale(config: dict, module: str, rank: int) -> float:
    alpha = config.get("lora_alpha", rank)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.search(pattern, module):
            alpha = value
    if config.get("use_rslora"):
        return alpha / math.sqrt(rank)
    return alpha / rank


def _read_config(folder: Path) -> dict:
    path = folder / "adapter_config.json"
    if not path.is_file():
        raise AdapterError(f"{folder} has no adapter_config.json")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"adapter_config.json is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError("adapter_config.json must hold a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"peft_type {config.get('peft_type')!r} is not LoRA")
    for key, why in (
        ("use_dora", "DoRA"),
        ("lora_bias", "LoRA biases"),
    ):
        if config.get(key):
            raise AdapterError(f"{why} ({key}) are not supported")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"bias {config.get('bias')!r} is not supported (only 'none')")
    if config.get("modules_to_save"):
        raise AdapterError(
            f"modules_to_save {config['modules_to_save']!r} is not supported: only the "
            "LoRA deltas of the attention and MLP projections can be served"
        )
    if "r" not in config:
        raise AdapterError("adapter_config.json has no rank (r)")
    return config


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    safetensors_path = folder / "adapter_model.safetensors"
    bin_path = folder / "adapter_model.bin"
    try:
        if safetensors_path.is_file():
            from safetensors.torch import load_file

            return load_file(str(safetensors_path))
        if bin_path.is_file():
            # weights_only: an adapter must not be able to run code on load.
            return torch.load(bin_path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise AdapterError(f"cannot read the adapter weights: {exc}") from None
    raise AdapterError(f"{folder} has neither adapter_model.safetensors nor adapter_model.bin")
