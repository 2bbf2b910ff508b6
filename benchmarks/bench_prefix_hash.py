"""Prefix-cache block keys: the cost of each hash algorithm.

Times the KV cache manager's own hash functions (`runtime/core/kv_cache_manager.py`)
on 16-token blocks, per block and for a whole 4,096-token prompt, beside the
old pickle-based sha256 and, if the `xxhash` package is installed, xxh3-128
over the same bytes: the candidates for the default key.

    .venv/bin/python benchmarks/bench_prefix_hash.py [--out .bench/prefix_hash.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import platform
import random
import statistics
import time
from array import array
from pathlib import Path

from pagoda.runtime.core.kv_cache_manager import builtin_block_hash, sha256_block_hash

BLOCK = 16
PROMPT = 4096


def sha256_pickle(parent, tokens, extra):
    """The key before this change: sha256 of a pickled (parent, tokens, extra)."""
    return hashlib.sha256(pickle.dumps((parent, tuple(tokens), extra), protocol=5)).digest()


def candidates() -> dict:
    fns = {
        "builtin (hash of a tuple)": builtin_block_hash,
        "sha256, compact (default)": sha256_block_hash,
        "sha256 over pickle (old)": sha256_pickle,
    }
    try:
        import xxhash

        def xxh3_128(parent, tokens, extra):
            return xxhash.xxh3_128_digest(parent + array("I", tokens).tobytes())

        fns["xxh3-128 (not installed by default)"] = xxh3_128
    except ImportError:
        pass
    return fns


def time_chain(fn, blocks: list[list[int]], root, repeats: int) -> float:
    """Median seconds to hash the chain of `blocks` once."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        parent = root
        for block in blocks:
            parent = fn(parent, block, ())
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rng = random.Random(0)
    tokens = [rng.randrange(128_000) for _ in range(PROMPT)]
    blocks = [tokens[i : i + BLOCK] for i in range(0, PROMPT, BLOCK)]
    root = hashlib.sha256(b"root").digest()
    rows = []
    for name, fn in candidates().items():
        seconds = time_chain(fn, blocks, root if "builtin" not in name else 0, args.repeats)
        rows.append(
            {
                "algorithm": name,
                "us_per_block": seconds / len(blocks) * 1e6,
                "us_per_4k_prompt": seconds * 1e6,
            }
        )
    print(f"{'algorithm':40s} {'µs/block':>9s} {'µs per 4k-token prompt':>24s}")
    for r in rows:
        print(f"{r['algorithm']:40s} {r['us_per_block']:9.3f} {r['us_per_4k_prompt']:24.1f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"python": platform.python_version(), "machine": platform.processor()}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
