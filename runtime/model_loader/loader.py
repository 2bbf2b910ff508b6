"""Build the model and fill its weights from the configured source."""

from __future__ import annotations

import logging
import sys
import time

import torch
from pagoda.runtime.distributed.parallel_state import TensorParallelGroup
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.model_loader.gguf_loader import count_gguf_tensors, iter_gguf_weights
from pagoda.runtime.model_loader.hf_loader import iter_hf_weights, weight_files
from pagoda.runtime.model_loader.random_loader import iter_random_weights
from pagoda.runtime.models.llama import LlamaForCausalLM
from torch import nn

logger = logging.getLogger(__name__)


def _progress(iterable, total: int | None, desc: str):
    # A bar only on a terminal; logs get the one-line summary instead.
    if not sys.stderr.isatty():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="tensor", leave=False)


def load_model(
    cfg: ModelConfig,
    seed: int = 0,
    tp: TensorParallelGroup | None = None,
    device: torch.device | None = None,
) -> nn.Module:
    """Instantiate the model in its dtype on `device` (default: the config's)
    and load this rank's shard of every weight."""
    start = time.perf_counter()
    device = device or cfg.device
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(cfg.dtype)
    try:
        with device:
            model = LlamaForCausalLM(cfg.arch, tp)
    finally:
        torch.set_default_dtype(default_dtype)

    total = None
    if cfg.source == "random":
        weights = iter_random_weights(cfg.arch, seed, device)
    elif cfg.source == "gguf":
        # GGUF tensors are quantized: dequantized whole, then each rank slices.
        weights = iter_gguf_weights(cfg.path, cfg.arch)
        total = count_gguf_tensors(cfg.path)
    else:
        weights = iter_hf_weights(weight_files(cfg.path))
    loaded = model.load_weights(_progress(weights, total, f"Loading {cfg.model}"))
    missing = set(dict(model.named_parameters())) - loaded
    if missing:
        raise ValueError(f"checkpoint lacks weights for: {', '.join(sorted(missing)[:8])}")
    model.eval()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    logger.info(
        "Loaded %s (%s, %s) on %s: %.2f GiB of weights in %.1f s",
        cfg.model,
        cfg.source,
        str(cfg.dtype).removeprefix("torch."),
        device
        if tp is None or tp.world_size == 1
        else f"{device} (rank {tp.rank}/{tp.world_size})",
        nbytes / 2**30,
        time.perf_counter() - start,
    )
    return model
