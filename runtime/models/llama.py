"""The Llama family (Llama 2/3, Mistral, Qwen2, SmolLM) over a paged KV cache.

Layouts follow vLLM: fused QKV and gate-up projections, pre-norm with the
residual add fused into RMSNorm, and a flattened batch of tokens (no padding):
every tensor is [num_tokens, ...] and attention metadata says which request
each token belongs to.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pagoda.runtime.attention.backend import AttentionMetadata
from pagoda.runtime.distributed.parallel_state import TensorParallelGroup
from pagoda.runtime.layers.activation import SiluAndMul
from pagoda.runtime.layers.attention import Attention
from pagoda.runtime.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from pagoda.runtime.layers.layernorm import RMSNorm
from pagoda.runtime.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from pagoda.runtime.layers.rotary import RotaryEmbedding
from pagoda.runtime.model_loader.weights import Weight, copy_weight
from pagoda.runtime.models.arch_config import ModelArchConfig
from torch import nn


class LlamaAttention(nn.Module):
    def __init__(
        self,
        cfg: ModelArchConfig,
        tp: TensorParallelGroup | None = None,
        rotary_emb: RotaryEmbedding | None = None,
    ):
        super().__init__()
        tp_size = tp.world_size if tp is not None else 1
        self.head_dim = cfg.head_dim
        self.num_heads = cfg.num_attention_heads // tp_size
        # Fewer KV heads than ranks: each rank keeps (a replica of) one.
        self.num_kv_heads = max(1, cfg.num_key_value_heads // tp_size)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size,
            self.head_dim,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            bias=cfg.attention_bias,
            tp=tp,
        )
        self.o_proj = RowParallelLinear(
            cfg.num_attention_heads * self.head_dim, cfg.hidden_size, False, tp
        )
        self.rotary_emb = rotary_emb if rotary_emb is not None else _rotary(cfg)
        self.attn = Attention(self.num_heads, self.head_dim, self.num_kv_heads, self.head_dim**-0.5)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        t = hidden.shape[0]
        q, k = self.rotary_emb(
            positions,
            q.view(t, self.num_heads, self.head_dim),
            k.view(t, self.num_kv_heads, self.head_dim),
        )
        out = self.attn(q.reshape(t, -1), k.reshape(t, -1), v, metadata)
        return self.o_proj(out)


def _rotary(cfg: ModelArchConfig) -> RotaryEmbedding:
    return RotaryEmbedding(
        cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling
    )


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelArchConfig, tp: TensorParallelGroup | None = None):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            cfg.hidden_size, [cfg.intermediate_size] * 2, False, tp
        )
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, False, tp)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelArchConfig,
        tp: TensorParallelGroup | None = None,
        rotary_emb: RotaryEmbedding | None = None,
    ):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, tp, rotary_emb)
        self.mlp = LlamaMLP(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelArchConfig, tp: TensorParallelGroup | None = None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        # One cos/sin cache for all layers: it is [max_position, head_dim]
        # floats, 64 MiB per copy for Llama 3.1's 131072 positions.
        rotary = _rotary(cfg)
        self.layers = nn.ModuleList(
            [LlamaDecoderLayer(cfg, tp, rotary) for _ in range(cfg.num_hidden_layers)]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, metadata)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """Checkpoint tensors by Hugging Face name map onto fused parameters here."""

    # HF name fragment -> (our fused parameter's name fragment, shard id)
    packed_modules: ClassVar[dict[str, tuple[str, str | int]]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelArchConfig, tp: TensorParallelGroup | None = None):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, tp)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp)
        if cfg.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        return self.model(input_ids, positions, metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits over the whole vocabulary on the first TP rank; None on the others."""
        return self.lm_head.compute_logits(hidden)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def load_weights(self, weights) -> set[str]:
        """Load (hf_name, tensor) pairs; returns the names of parameters loaded.

        Tensors the model does not use (rotary caches saved by old
        checkpoints, a tied lm_head) are skipped.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        # Fused parameter -> shard ids seen. A fused parameter counts as loaded
        # only once every part is in: with one part missing (say k_proj) the
        # rest would load and its slice stay uninitialized memory.
        shards_seen: dict[str, set] = {}
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            if _layer_index(name) >= self.config.num_hidden_layers:
                continue  # hf_overrides shrank the model to its first layers
            shard_id = None
            for hf_part, (ours, sid) in self.packed_modules.items():
                if f".{hf_part}." in name:
                    name, shard_id = name.replace(f".{hf_part}.", f".{ours}."), sid
                    break
            if name not in params:
                raise KeyError(f"checkpoint tensor {name!r} has no parameter in the model")
            param = params[name]
            loader = getattr(param, "weight_loader", _default_loader)
            with torch.no_grad():
                loader(param, tensor, shard_id)
            if shard_id is None:
                loaded.add(name)
            else:
                shards_seen.setdefault(name, set()).add(shard_id)
        missing = []
        for name, seen in shards_seen.items():
            absent = [
                name.replace(f".{ours}.", f".{hf_part}.")
                for hf_part, (ours, sid) in self.packed_modules.items()
                if f".{ours}." in name and sid not in seen
            ]
            if absent:
                missing += absent
            else:
                loaded.add(name)
        if missing:
            raise ValueError(f"checkpoint lacks weights for: {', '.join(sorted(missing))}")
        return loaded


def _layer_index(name: str) -> int:
    """The decoder layer a checkpoint tensor belongs to; -1 for the others."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "model" and parts[1] == "layers":
        return int(parts[2])
    return -1


def _default_loader(param: nn.Parameter, loaded: Weight, shard_id=None) -> None:
    copy_weight(param.data, loaded)
