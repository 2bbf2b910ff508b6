"""The C++ CPU attention kernels alone: decode at batch 1 and 16 (K/V from
memory: 24 different caches in turn, as a step's layers read theirs) and a
step of prefill chunks, for bf16, float32, and float32 over a
float16 KV cache (kv_cache_dtype).

`--so PATH` loads a given build of the extension instead of this source's
(builds live in ~/.cache/pagoda/kernels/cpu-<hash>/), so two versions of a
kernel can be compared in alternating runs:

    python benchmarks/bench_cpu_attention.py
    python benchmarks/bench_cpu_attention.py --so ~/.cache/pagoda/kernels/cpu-<old>/pagoda_cpu_kernels.so
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1] / "tests" / "kernels" / "cpu"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_extension(so: str | None):
    if so is None:
        from pagoda.kernels.cpu import build

        return build()
    loader = importlib.machinery.ExtensionFileLoader("pagoda_cpu_kernels", so)
    spec = importlib.util.spec_from_file_location("pagoda_cpu_kernels", so, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def bench_decode(ext, dtype, batch: int, reps: int, caches: int = 24, cache_dtype=None) -> float:
    """Median us per call; 3 KV heads x 3 (SmolLM2), head size 64, 16-position
    blocks; `caches` distinct caches called in turn (1: the K/V stay in cache),
    in `cache_dtype` (default: the query's)."""
    # The test's batch builder: scattered blocks, NaN everywhere else.
    t = _module(TESTS / "test_decode_attention.py", "decode_test")
    rng = random.Random(0)
    lens = [rng.randint(33, 576) for _ in range(batch)]
    batches = [
        t.make_batch(lens, 3, 3, 64, 16, dtype, seed=s, cache_dtype=cache_dtype)
        for s in range(caches)
    ]
    times = []
    for _ in range(reps):
        for q, cache, table, _, _ in batches:
            out = torch.empty_like(q)
            seq_lens = torch.tensor(lens, dtype=torch.int32)
            tokens = torch.arange(batch)
            start = time.perf_counter()
            ext.decode_attention(out, q, cache, table, seq_lens, tokens, 0.125)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


# Prefill chunks (seq_len, q_len): a mixed step, and the shared-prefix
# workload's cached step (four ~80-token suffixes after a 384-token cached
# system prompt: little compute per packed block).
MIXED_CHUNKS = [(272, 272), (400, 256), (128, 128), (500, 100)]
CACHED_PREFIX_CHUNKS = [(448, 64), (464, 80), (480, 96), (432, 48)]
# One request's suffix alone, as the first request of a wave is prefilled:
# few tasks (9 on SmolLM2's 3 KV heads), so their balance over the threads shows.
ONE_SUFFIX_CHUNKS = [(464, 80)]


def bench_prefill(
    ext, dtype, reps: int, cache_dtype=None, chunks=MIXED_CHUNKS
) -> tuple[float, float]:
    """Median ms per call and GFLOP/s for a step of `chunks`."""
    t = _module(TESTS / "test_prefill_attention.py", "prefill_test")
    q, cache, table, lens, qsl, _, _ = t.make_step(chunks, 3, 3, 64, dtype, cache_dtype=cache_dtype)
    rows = torch.arange(len(chunks))
    out = torch.empty_like(q)
    flops = sum(4 * ql * (s - ql / 2) * 9 * 64 for s, ql in chunks)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        ext.prefill_attention(out, q, cache, table, lens, qsl, rows, 0.125)
        times.append(time.perf_counter() - start)
    m = statistics.median(times)
    return m * 1e3, flops / m / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--so", default=None, help="a built pagoda_cpu_kernels.so to load")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument(
        "--hot",
        action="store_true",
        help="also decode at batch 16 from one cache, K/V in cache (the compute alone)",
    )
    p.add_argument("--prefill-only", action="store_true", help="skip the decode calls")
    ns = p.parse_args()
    torch.set_num_threads(ns.threads)
    ext = load_extension(ns.so)
    # (model dtype, KV cache dtype): float32 with a float16 cache is
    # llama.cpp's default configuration under F32 weights.
    combos = [
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32),
        (torch.float32, torch.float16),
    ]
    for dtype, cache_dtype in combos:
        name = str(dtype).removeprefix("torch.") + "/" + str(cache_dtype).removeprefix("torch.")
        for batch in () if ns.prefill_only else (1, 16):
            us = bench_decode(ext, dtype, batch, ns.reps, cache_dtype=cache_dtype)
            print(f"decode  {name:17} batch {batch:2}: {us:8.1f} us", flush=True)
        if ns.hot and not ns.prefill_only:
            us = bench_decode(ext, dtype, 16, 24 * ns.reps, caches=1, cache_dtype=cache_dtype)
            print(f"decode  {name:17} batch 16, K/V in cache: {us:8.1f} us", flush=True)
        ms, gflops = bench_prefill(ext, dtype, 2 * ns.reps, cache_dtype=cache_dtype)
        print(f"prefill {name:17} 4 chunks: {ms:8.2f} ms  {gflops:5.0f} GFLOP/s", flush=True)
        ms, gflops = bench_prefill(
            ext, dtype, 2 * ns.reps, cache_dtype=cache_dtype, chunks=CACHED_PREFIX_CHUNKS
        )
        print(f"prefill {name:17} 4 suffixes: {ms:6.2f} ms  {gflops:5.0f} GFLOP/s", flush=True)
        ms, gflops = bench_prefill(
            ext, dtype, 4 * ns.reps, cache_dtype=cache_dtype, chunks=ONE_SUFFIX_CHUNKS
        )
        print(f"prefill {name:17} 1 suffix: {ms:8.2f} ms  {gflops:5.0f} GFLOP/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
