"""The serving benchmark of docs/benchmarks.md, in one run:

1. the server's output throughput at concurrency 16 over the offline engine's
   on the same workload (same prompts, same engine flags, max_num_seqs 16 on
   both so both batch at most 16 requests);
2. TTFT on the shared-prefix dataset with and without prefix caching;
3. start-up time: launch of `pagoda serve` to the first 200 on /health.

The machine this runs on may be noisy, so the runs alternate (server with
prefix caching, server without, offline) for --rounds rounds and the report
gives medians. Usage:

    python benchmarks/bench_serving.py --rounds 3 --result-file serving.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from pagoda.runtime.entrypoints.bench_serve import (
    format_table,
    random_dataset,
    run_benchmark,
    shared_prefix_dataset,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_process import ServerProcess, free_port, pagoda_serve_cmd


def pagoda_server(flags: list[str], extra: list[str]) -> ServerProcess:
    port = free_port()
    return ServerProcess("pagoda", pagoda_serve_cmd(port, *flags, *extra), port)


def offline_throughput(llm, requests) -> dict:
    from pagoda.runtime.sampling_params import SamplingParams

    params = [
        SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in requests
    ]
    start = time.perf_counter()
    outs = llm.generate([r.prompt_token_ids for r in requests], params)
    duration = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"duration_s": duration, "output_tokens": tokens, "output_throughput": tokens / duration}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--prefix-len", type=int, default=512)
    p.add_argument("--suffix-len", type=int, default=32)
    p.add_argument("--prefix-output-len", type=int, default=8)
    p.add_argument("--prefix-prompts", type=int, default=32)
    p.add_argument("--prefix-concurrency", type=int, default=4)
    p.add_argument("--num-threads", type=int, default=os.cpu_count())
    p.add_argument("--result-file", default=None)
    ns = p.parse_args()

    engine = {
        "dtype": "float32",
        "max_model_len": 1024,
        "kv_cache_memory_gib": 0.5,
        "max_num_seqs": ns.concurrency,
    }
    flags = ["--dtype", "float32", "--max-model-len", "1024", "--kv-cache-memory", "0.5",
             "--max-num-seqs", str(ns.concurrency), "--num-threads", str(ns.num_threads)]  # fmt: skip
    vocab = (100, 32000)
    workload = random_dataset(ns.num_prompts, ns.input_len, ns.output_len, 0, vocab)
    # Warm-ups use other prompts: a warm-up over the workload itself would
    # leave its prompts in the prefix cache and skip their prefill later.
    warmup = random_dataset(4, ns.input_len, ns.output_len, 99, vocab)
    shared = shared_prefix_dataset(
        ns.prefix_prompts, ns.prefix_len, ns.suffix_len, ns.prefix_output_len, 4, 1, vocab
    )

    import torch
    from pagoda.runtime.entrypoints.llm import LLM

    torch.set_num_threads(ns.num_threads)
    # The offline engine lives for every round and sees the same prompts each
    # time: without caching, each round computes every prefill, as the
    # freshly started server does.
    llm = LLM("smollm2-135m-instruct", enable_prefix_caching=False, **engine)
    offline_throughput(llm, warmup)

    rounds = []
    for r in range(ns.rounds):
        row: dict = {}
        server = pagoda_server(flags, ["--enable-prefix-caching"])
        row["startup_s"] = server.startup_s
        try:
            asyncio.run(run_benchmark(server.url, warmup, max_concurrency=4))
            row["server"] = asyncio.run(
                run_benchmark(server.url, workload, max_concurrency=ns.concurrency)
            )
            row["prefix_on"] = asyncio.run(
                run_benchmark(server.url, shared, max_concurrency=ns.prefix_concurrency)
            )
        finally:
            server.stop(check=True)
        row["offline"] = offline_throughput(llm, workload)
        server = pagoda_server(flags, ["--no-enable-prefix-caching"])
        row["startup_nocache_s"] = server.startup_s
        try:
            asyncio.run(run_benchmark(server.url, warmup, max_concurrency=4))
            row["prefix_off"] = asyncio.run(
                run_benchmark(server.url, shared, max_concurrency=ns.prefix_concurrency)
            )
        finally:
            server.stop(check=True)
        row["ratio"] = row["server"]["output_throughput"] / row["offline"]["output_throughput"]
        rounds.append(row)
        print(
            f"round {r}: server {row['server']['output_throughput']:.1f} tok/s, offline "
            f"{row['offline']['output_throughput']:.1f} tok/s, ratio {row['ratio']:.3f}; "
            f"TTFT mean prefix on {row['prefix_on']['ttft_s']['mean'] * 1000:.0f} ms, off "
            f"{row['prefix_off']['ttft_s']['mean'] * 1000:.0f} ms; start-up "
            f"{row['startup_s']:.1f} / {row['startup_nocache_s']:.1f} s",
            flush=True,
        )

    def med(values):
        return statistics.median(values)

    summary = {
        "throughput_ratio_median": med([r["ratio"] for r in rounds]),
        "server_output_tok_s_median": med([r["server"]["output_throughput"] for r in rounds]),
        "offline_output_tok_s_median": med([r["offline"]["output_throughput"] for r in rounds]),
        "ttft_prefix_on_mean_ms_median": med(
            [r["prefix_on"]["ttft_s"]["mean"] * 1e3 for r in rounds]
        ),
        "ttft_prefix_off_mean_ms_median": med(
            [r["prefix_off"]["ttft_s"]["mean"] * 1e3 for r in rounds]
        ),
        "ttft_prefix_on_p50_ms_median": med(
            [r["prefix_on"]["ttft_s"]["median"] * 1e3 for r in rounds]
        ),
        "ttft_prefix_off_p50_ms_median": med(
            [r["prefix_off"]["ttft_s"]["median"] * 1e3 for r in rounds]
        ),
        "startup_s_median": med(
            [s for r in rounds for s in (r["startup_s"], r["startup_nocache_s"])]
        ),
        "load_average": os.getloadavg(),
        "config": vars(ns),
    }
    print("\nLast server run at concurrency", ns.concurrency)
    print(format_table(rounds[-1]["server"]))
    print(json.dumps(summary, indent=2))
    if ns.result_file:
        with open(ns.result_file, "w") as f:
            json.dump({"summary": summary, "rounds": rounds}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
