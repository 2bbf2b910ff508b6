"""The attention layer: projections live in the model; this holds the
per-layer KV cache and hands the computation to the selected backend."""

from __future__ import annotations

import torch
from pagoda.runtime.attention.backend import AttentionBackend, AttentionMetadata
from torch import nn


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_size: int, num_kv_heads: int, scale: float):
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.backend: AttentionBackend | None = None
        # Bound by the model runner once the cache is allocated; empty before,
        # so a forward without a cache fails loudly instead of silently.
        self.kv_cache = torch.empty(0)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        """q: [T, Hq*D], k/v: [T, Hkv*D] -> [T, Hq*D]."""
        assert self.backend is not None, "attention backend not set"
        t = q.shape[0]
        out = self.backend.forward(
            q.view(t, self.num_heads, self.head_size),
            k.view(t, self.num_kv_heads, self.head_size),
            v.view(t, self.num_kv_heads, self.head_size),
            self.kv_cache,
            metadata,
            self.scale,
        )
        return out.reshape(t, self.num_heads * self.head_size)
