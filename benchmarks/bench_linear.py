"""The packed linear kernels, pagoda's against oneDNN's, on one model's
projection shapes.

Each shape gets 30 distinct weights (3 at 64 rows and more), called in turn,
so the weights come from memory as in a step of the model rather than from
cache; both kernels run alternately, 7 rounds, and the medians are printed
with the effective GFLOP/s and the error against a float64 reference.

    python benchmarks/bench_linear.py --rows 1 4 16 64 512 --threads 2

With `--bf16-ways`, bf16 on a CPU with AVX512-BF16 compares pagoda's two
ways instead: pair dot products against the pair layout widened to float32
in registers (`widen_from_rows` 0 and 1), which is what the per-machine
choice `pagoda.kernels.cpu.bf16_widen_rows` measures.

    python benchmarks/bench_linear.py --rows 1 4 16 64 256 --dtypes bfloat16 --bf16-ways
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import torch

# SmolLM2-135M: qkv, o, gate_up, down (out, in).
SMOLLM2_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def timed(linear, x, weights) -> float:
    """Seconds per call of x @ W^T over `weights`, in turn."""
    start = time.perf_counter()
    for w in weights:
        linear(x, w, None)
    return (time.perf_counter() - start) / len(weights)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 512])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--bf16-ways", action="store_true", help="bf16: pagoda's pairs against widened in registers"
    )
    ns = ap.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    from pagoda.runtime.layers import packed_linear

    for name in ns.dtypes:
        dtype = getattr(torch, name)
        if not (
            packed_linear.onednn_available(dtype)
            and packed_linear.available(dtype, torch.device("cpu"))
        ):
            print(f"{name}: both kernels are needed here; skipped")
            continue
        for rows in ns.rows:
            for n, k in SMOLLM2_SHAPES:
                plain = [torch.randn(n, k).to(dtype) for _ in range(30 if rows < 64 else 3)]
                pagoda = [packed_linear.pack(w, rows, kernel="pagoda") for w in plain]
                if ns.bf16_ways and dtype == torch.bfloat16:
                    names = ("pairs", "widened")
                    first = [dataclasses.replace(p, widen_rows=0) for p in pagoda]
                    second = [dataclasses.replace(p, widen_rows=1) for p in pagoda]
                else:
                    names = ("onednn", "pagoda")
                    first = [packed_linear.pack(w, rows, kernel="onednn") for w in plain]
                    second = pagoda
                x = torch.randn(rows, k).to(dtype)
                ref = x.double() @ plain[0].double().T
                got = packed_linear.linear(x, second[0], None).double()
                err = ((got - ref).abs().max() / ref.abs().max()).item()
                a, b = [], []
                timed(packed_linear.linear, x, first)  # warm-up: oneDNN's first call plans
                timed(packed_linear.linear, x, second)
                for _ in range(ns.rounds):
                    a.append(timed(packed_linear.linear, x, first))
                    b.append(timed(packed_linear.linear, x, second))
                ta, tb = statistics.median(a) * 1e6, statistics.median(b) * 1e6
                gflop = 2 * rows * n * k / 1e3
                print(
                    f"{name:8s} rows={rows:3d} {n}x{k}: {names[0]} {ta:7.1f} us  "
                    f"{names[1]} {tb:7.1f} us  x{ta / tb:.2f}  "
                    f"GFLOP/s {gflop / ta:4.0f} / {gflop / tb:4.0f}  rel.err {err:.1e}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
