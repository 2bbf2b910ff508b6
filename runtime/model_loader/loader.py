"""Build the model and fill its weights from the configured source."""

from __future__ import annotations

import logging
import sys
import time

import torch
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.model_loader.gguf_loader import count_gguf_tensors, iter_gguf_weights
from pagoda.runtime.model_loader.hf_loader import iter_hf_weights, weight_files
from pagoda.runtime.model_loader.random_loader import init_random_weights
from pagoda.runtime.models.llama import LlamaForCausalLM
from torch import nn

logger = logging.getLogger(__name__)


def _progress(iterable, total: int | None, desc: str):
    # A bar only on a terminal; logs get the one-line summary instead.
    if not sys.stderr.isatty():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="tensor", leave=False)


def load_model(cfg: ModelConfig, seed: int = 0) -> nn.Module:
    """Instantiate the model on its device in its dtype and load weights."""
    start = time.perf_counter()
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(cfg.dtype)
    try:
        with cfg.device:
            model = LlamaForCausalLM(cfg.arch)
    finally:
        torch.set_default_dtype(default_dtype)

    if cfg.source == "random":
        init_random_weights(model, seed)
    else:
        if cfg.source == "gguf":
            weights = iter_gguf_weights(cfg.path, cfg.arch)
            total = count_gguf_tensors(cfg.path)
        else:
            weights = iter_hf_weights(weight_files(cfg.path))
            total = None
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
        cfg.device,
        nbytes / 2**30,
        time.perf_counter() - start,
    )
    return model
