"""Our model, built the way the engine builds it, and its paged KV cache."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every model test runs on one thread (see `one_thread`)."""


def load_pagoda_model(**engine_args):
    """resolve_model_config + load_model in float32 on the CPU, every attention
    layer bound to the torch backend (no cache yet: see `bind_kv_cache`)."""
    from pagoda.runtime.attention.torch_backend import TorchAttentionBackend
    from pagoda.runtime.config import EngineArgs
    from pagoda.runtime.model_loader.loader import load_model
    from pagoda.runtime.model_loader.resolve import resolve_model_config

    cfg = resolve_model_config(EngineArgs(dtype="float32", device="cpu", **engine_args))
    model = load_model(cfg)
    backend = TorchAttentionBackend()
    for layer in model.attention_layers():
        layer.backend = backend
    return model


def bind_kv_cache(model, num_blocks: int, block_size: int) -> None:
    """Give every attention layer a fresh cache of `kv_cache_shape(...)`.

    Filled with a large finite value, not zeros: attention that reads a slot
    no request wrote changes the output visibly (NaN would poison even
    masked-out reads, which the torch backend legitimately makes)."""
    from pagoda.runtime.attention.backend import kv_cache_shape

    a = model.config
    shape = kv_cache_shape(num_blocks, block_size, a.num_key_value_heads, a.head_dim)
    for layer in model.attention_layers():
        layer.kv_cache = torch.full(shape, 1e4, dtype=torch.float32)


@torch.no_grad()
def forward_step(model, token_ids, requests, block_size: int, paged_step) -> torch.Tensor:
    """Logits of every token of one flattened step; `requests` as for
    `paged_step`, `token_ids` the step's new tokens back to back."""
    metadata, positions = paged_step(requests, block_size)
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    assert ids.shape[0] == positions.shape[0]
    return model.compute_logits(model(ids, positions, metadata))


@pytest.fixture(scope="session")
def model_step(paged_step):
    return lambda model, ids, requests, block_size: forward_step(
        model, ids, requests, block_size, paged_step
    )


@pytest.fixture(scope="session")
def pagoda_model():
    return load_pagoda_model


@pytest.fixture(scope="session")
def kv_cache_binder():
    return bind_kv_cache


@pytest.fixture(scope="session")
def pagoda_smollm2(smollm2_gguf):
    """Our LlamaForCausalLM with the real SmolLM2 GGUF weights, from the
    default (built-in) model name (about 9 s). `smollm2_gguf` skips without them."""
    return load_pagoda_model()
