"""Decode-shaped linears (a few rows times a large weight) on a GPU: cuBLAS
against a Triton skinny GEMM, as bandwidth over the weight bytes.

At batch 1 a decode step is almost all weight reads: Llama-3-8B's step reads
15 GB of weights and a few MB of K/V. The step's gap to the roofline is the
linears' gap to the copy bandwidth, and cuBLAS's decode GEMMs on an H100 read
weights at 55-90% of it (benchmarks/gpu/profile_decode_step.py). This times
whether a plain Triton kernel, one program per BLOCK_N output columns (and
SPLIT_K slices of K, summed with atomics), reads faster.

Every timed call is one of several weight copies (together over 4x the L2
cache), back to back in one CUDA graph; the median replay over the calls.

    python benchmarks/gpu/bench_skinny_gemm.py --rows 1 16
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

# Llama-3-8B's linears: (K, N) of x[M, K] @ W[N, K]^T.
SHAPES = {
    "qkv": (4096, 6144),
    "o": (4096, 4096),
    "gate_up": (4096, 28672),
    "down": (14336, 4096),
    "lm_head": (4096, 128256),
}
# (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)
CONFIGS = [
    (16, 256, 1, 4, 4),
    (32, 256, 1, 4, 4),
    (64, 128, 1, 4, 4),
    (32, 512, 1, 4, 3),
    (16, 512, 2, 4, 3),
    (32, 256, 2, 4, 4),
    (64, 256, 2, 8, 3),
    (64, 128, 4, 4, 4),
]


@triton.jit
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_span = tl.cdiv(K, SPLIT_K * BLOCK_K) * BLOCK_K
    k_lo = pid_k * k_span
    k_hi = tl.minimum(k_lo + k_span, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        k_ok = offs_k < k_hi
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=(offs_m[:, None] < M) & k_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None],
            mask=(offs_n[None, :] < N) & k_ok[:, None],
            other=0.0,
        )
        if DOT_F32:  # the CPU interpreter's 16-bit dot is not exact
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32))
        else:
            acc += tl.dot(x, w)
    y = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    ok = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        tl.atomic_add(y, acc, mask=ok)


def skinny_gemm(x: torch.Tensor, w: torch.Tensor, config: tuple) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T for M <= 16, in x's dtype."""
    block_n, block_k, split_k, warps, stages = config
    m, k = x.shape
    n = w.shape[0]
    y = (
        torch.empty((m, n), dtype=x.dtype, device=x.device)
        if split_k == 1
        else torch.zeros((m, n), dtype=torch.float32, device=x.device)
    )
    _skinny_gemm_kernel[(triton.cdiv(n, block_n), split_k)](
        x,
        w,
        y,
        m,
        n,
        k,
        x.stride(0),
        w.stride(0),
        y.stride(0),
        BLOCK_M=16,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLIT_K=split_k,
        DOT_F32=os.environ.get("TRITON_INTERPRET") == "1",
        num_warps=warps,
        num_stages=stages,
    )
    return y if split_k == 1 else y.to(x.dtype)


def time_calls(fn, weights: list[torch.Tensor], reps: int = 20) -> float:
    """Median seconds per call: one graph calls fn on every weight copy."""
    for w in weights:
        fn(w)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(g, stream=stream):
        for w in weights:
            fn(w)
    torch.cuda.synchronize()
    g.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(weights))
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_skinny_gemm needs a CUDA device")
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    print(
        f"{'shape':>8} {'M':>3} {'cublas GB/s':>11} {'best triton':>11} {'config':>18} {'err':>8}"
    )
    for name, (k, n) in SHAPES.items():
        nbytes = n * k * 2
        weights = [
            torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
            for _ in range(max(2, -(-4 * l2 // nbytes)))
        ]
        for m in args.rows:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            t_cublas = time_calls(lambda w, x=x: torch.nn.functional.linear(x, w), weights)
            ref = (x.double() @ weights[0].double().T).float()
            best = (float("inf"), None, float("nan"))
            for cfg in CONFIGS:
                try:
                    out = skinny_gemm(x, weights[0], cfg).float()
                    err = ((out - ref).norm() / ref.norm()).item()
                    if not err < 2e-2:
                        print(f"{name:>8} {m:>3} config {cfg} wrong: rel error {err:.2e}")
                        continue
                    t = time_calls(lambda w, x=x, cfg=cfg: skinny_gemm(x, w, cfg), weights)
                except Exception as exc:  # a config over the shared memory
                    print(f"{name:>8} {m:>3} config {cfg} failed: {type(exc).__name__}")
                    continue
                print(f"    {name} M={m} {cfg}: {nbytes / t / 1e9:.0f} GB/s", flush=True)
                if t < best[0]:
                    best = (t, cfg, err)
            t, cfg, err = best
            if cfg is None:
                print(f"{name:>8} {m:>3} {nbytes / t_cublas / 1e9:>11.0f}  no Triton config ran")
                continue
            print(
                f"{name:>8} {m:>3} {nbytes / t_cublas / 1e9:>11.0f} {nbytes / t / 1e9:>11.0f} "
                f"{cfg!s:>18} {err:>8.1e}",
                flush=True,
            )
        del weights
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
