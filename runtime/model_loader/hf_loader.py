"""Load weights from a Hugging Face model folder (config.json + safetensors)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from pagoda.runtime.model_loader.weights import LazyWeight, Weight
from pagoda.runtime.models.arch_config import ModelArchConfig


def read_hf_config(folder: Path, overrides: dict | None = None) -> ModelArchConfig:
    with open(folder / "config.json") as f:
        return ModelArchConfig.from_hf_dict(json.load(f), overrides)


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's files: those the sharded index names, else every
    *.safetensors, else PyTorch *.bin files."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        with open(index) as f:
            return sorted({folder / name for name in json.load(f)["weight_map"].values()})
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    files = sorted(p for p in folder.glob("*.bin") if "training_args" not in p.name)
    if files:
        return files
    raise FileNotFoundError(f"no *.safetensors or *.bin weights in {folder}")


def iter_hf_weights(files: list[Path]) -> Iterator[tuple[str, Weight]]:
    """(name, tensor) for every checkpoint tensor. safetensors tensors come
    lazily: each weight loader reads only the shard its rank keeps."""
    from safetensors import safe_open

    for path in files:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    yield name, LazyWeight(f.get_slice(name))
        else:
            # weights_only: a checkpoint must not be able to run code on load.
            state = torch.load(path, map_location="cpu", weights_only=True)
            yield from state.items()
