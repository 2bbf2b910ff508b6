"""The elementwise layers on the CPU: the torch twin the runtime runs
(`pagoda.kernels.reference`) against the alternatives it was chosen over.

Shapes are SmolLM2-135M's (hidden 576, intermediate 1536, 9 query / 3 KV
heads of 64) at 1, 16 and 256 tokens, in float32 and bfloat16; medians of
five timed runs of a few hundred calls each.

    .venv/bin/python benchmarks/bench_layer_ops.py [--threads 2] [--out .bench/layer_ops.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from pagoda.kernels import reference

HIDDEN, INTER, HEADS, KV_HEADS, HEAD = 576, 1536, 9, 3, 64


def median_us(fn, calls: int = 200) -> float:
    for _ in range(20):
        fn()
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def rms_unfused(x, w, eps, r):
    """The layer's formula before it used the twin: four passes over x."""
    x = x + r
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype), x


def silu_fp32(x):
    """One rounding, fp32 math: what the Triton kernel computes."""
    d = x.shape[-1] // 2
    xf = x.float()
    return (F.silu(xf[..., :d]) * xf[..., d:]).to(x.dtype)


def rope_copy(positions, q, k, cache):
    """RoPE into new tensors (the layer's formula before it used the twin)."""
    cos, sin = cache[positions].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)

    def rotate(x):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    return rotate(q), rotate(k)


def measure(dtype: torch.dtype, tokens: int, cache: torch.Tensor) -> dict:
    x, r = torch.randn(tokens, HIDDEN, dtype=dtype), torch.randn(tokens, HIDDEN, dtype=dtype)
    w = torch.randn(HIDDEN, dtype=dtype)
    gu = torch.randn(tokens, 2 * INTER, dtype=dtype)
    q = torch.randn(tokens, HEADS, HEAD, dtype=dtype)
    k = torch.randn(tokens, KV_HEADS, HEAD, dtype=dtype)
    pos = torch.arange(tokens)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "tokens": tokens,
        "rms_norm_twin": median_us(lambda: reference.rms_norm_ref(x, w, 1e-5, r)),
        "rms_norm_unfused": median_us(lambda: rms_unfused(x, w, 1e-5, r)),
        "silu_and_mul_twin": median_us(lambda: reference.silu_and_mul_ref(gu)),
        "silu_and_mul_fp32": median_us(lambda: silu_fp32(gu)),
        "rope_twin_in_place": median_us(lambda: reference.rotary_embedding_ref(pos, q, k, cache)),
        "rope_copy": median_us(lambda: rope_copy(pos, q, k, cache)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    inv = 1.0 / (10000.0 ** (torch.arange(0, HEAD, 2).float() / HEAD))
    freqs = torch.outer(torch.arange(4096).float(), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], -1)
    for dtype in (torch.float32, torch.bfloat16):
        for tokens in (1, 16, 256):
            row = measure(dtype, tokens, cache)
            rows.append(row)
            print(
                f"{row['dtype']:9s} T={tokens:4d}  rms twin {row['rms_norm_twin']:6.1f} "
                f"unfused {row['rms_norm_unfused']:6.1f} | silu twin {row['silu_and_mul_twin']:7.1f} "
                f"fp32 {row['silu_and_mul_fp32']:7.1f} | rope twin {row['rope_twin_in_place']:6.1f} "
                f"copy {row['rope_copy']:6.1f}  (µs)"
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
