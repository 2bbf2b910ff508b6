"""Load a Llama-family model from a GGUF file (llama.cpp's format).

Quantized tensors are dequantized to float on load. llama.cpp stores Llama's
Q and K projections with their rows permuted for its interleaved RoPE; they
are permuted back to the rotate-half layout the model (and transformers) use.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from pagoda.runtime.models.arch_config import ModelArchConfig
from pagoda.runtime.sampling_params import InvalidRequestError

_GGUF_ARCHS = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
# Only llama.cpp's "llama" converter permutes Q/K rows.
_PERMUTED_ARCHS = {"llama", "mistral"}

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def _reader(path: Path):
    import gguf

    return gguf.GGUFReader(str(path))


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_gguf_config(path: Path, overrides: dict | None = None) -> ModelArchConfig:
    reader = _reader(path)
    arch = _field(reader, "general.architecture")
    if arch not in _GGUF_ARCHS:
        raise InvalidRequestError(
            f"general.architecture {arch!r} in {path.name} is not supported "
            f"(supported: {', '.join(sorted(_GGUF_ARCHS))})",
            param="architectures",
        )
    names = {t.name for t in reader.tensors}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = _field(reader, f"{arch}.vocab_size") or (len(tokens.data) if tokens else None)
    heads = _field(reader, f"{arch}.attention.head_count")
    hidden = _field(reader, f"{arch}.embedding_length")
    cfg = {
        "architectures": [_GGUF_ARCHS[arch]],
        "hidden_size": hidden,
        "intermediate_size": _field(reader, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _field(reader, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _field(reader, f"{arch}.attention.head_count_kv", heads),
        "head_dim": _field(reader, f"{arch}.attention.key_length", hidden // heads),
        "vocab_size": vocab,
        "rms_norm_eps": _field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": _field(reader, f"{arch}.rope.freq_base", 10000.0),
        "max_position_embeddings": _field(reader, f"{arch}.context_length", 4096),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        # Llama 3.1 GGUFs carry their RoPE scaling as a tensor of per-frequency
        # divisors (llama.cpp's rope_freqs), not as metadata: without it every
        # position would rotate at the unscaled frequencies.
        cfg["rope_scaling"] = {
            "rope_type": "freq_factors",
            "factors": np.asarray(freqs.data, dtype=np.float64).ravel().tolist(),
        }
    scaling_type = _field(reader, f"{arch}.rope.scaling.type")
    if scaling_type == "linear":
        cfg["rope_scaling"] = {
            "rope_type": "linear",
            "factor": _field(reader, f"{arch}.rope.scaling.factor"),
        }
    return ModelArchConfig.from_hf_dict(cfg, overrides)


def _hf_name(gguf_name: str) -> str | None:
    base, _, kind = gguf_name.rpartition(".")  # kind: weight | bias
    if base.startswith("blk."):
        _, idx, part = base.split(".", 2)
        mapped = _LAYER_NAMES.get(part)
        return None if mapped is None else f"model.layers.{idx}.{mapped}.{kind}"
    mapped = _GLOBAL_NAMES.get(base)
    return None if mapped is None else f"{mapped}.{kind}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    # Inverse of llama.cpp's permute(): rows grouped [head, 2, half] -> [head, half, 2].
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def iter_gguf_weights(path: Path, cfg: ModelArchConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Hugging Face name, float tensor) for every tensor of the file."""
    import gguf

    reader = _reader(path)
    arch = _field(reader, "general.architecture")
    for t in reader.tensors:
        name = _hf_name(t.name)
        if name is None:
            continue  # e.g. rope_freqs: read into the config's rope_scaling
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        data = np.asarray(data, dtype=np.float32).reshape(tuple(reversed(t.shape.tolist())))
        if arch in _PERMUTED_ARCHS:
            if name.endswith("q_proj.weight") or name.endswith("q_proj.bias"):
                data = _unpermute(data, cfg.num_attention_heads)
            elif name.endswith("k_proj.weight") or name.endswith("k_proj.bias"):
                data = _unpermute(data, cfg.num_key_value_heads)
        yield name, torch.from_numpy(np.require(data, requirements=["C", "W"]))


def count_gguf_tensors(path: Path) -> int:
    return len(_reader(path).tensors)
