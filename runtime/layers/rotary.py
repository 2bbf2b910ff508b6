"""Rotary position embeddings (Su et al., 2021), in the rotate-half layout
that Hugging Face's Llama uses, with the Llama 3 long-context frequency
scaling and linear position interpolation."""

from __future__ import annotations

import math

import torch
from pagoda.kernels import ops
from pagoda.runtime.layers.custom_op import CustomOp


def rope_inv_freq(head_size: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.float64) / head_size))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq.float()
    if kind == "linear":
        return (inv_freq / scaling["factor"]).float()
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling).float()
    if kind == "freq_factors":  # GGUF's rope_freqs: one divisor per frequency
        return (inv_freq / torch.tensor(scaling["factors"], dtype=torch.float64)).float()
    raise ValueError(f"rope_scaling type {kind!r} is not supported (default, linear, llama3)")


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, and
    # the band in between interpolated smoothly (Meta's reference code).
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(CustomOp):
    """Applies RoPE to q and k, in place, at the given positions."""

    def __init__(self, head_size: int, max_position: int, theta: float, scaling: dict | None):
        super().__init__()
        self.head_size = head_size
        inv_freq = rope_inv_freq(head_size, theta, scaling)
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        # [max_position, head_size]: cos of the head_size/2 frequencies, then
        # their sin (vLLM's layout, which the kernel and its twin read).
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hkv, D] (views are fine: the projection's
        output is rotated where it lies); returns q and k, rotated."""
        ops.rotary_embedding(
            positions,
            q,
            k,
            self.cos_sin_cache,
            triton=self.use_triton,
            cpu=self.use_cpu_kernels,
        )
        return q, k
