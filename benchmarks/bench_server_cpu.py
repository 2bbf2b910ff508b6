"""Where a served token's CPU time goes: the API server, the engine core and
the benchmark client, in CPU milliseconds per output token.

On a machine with as many cores as the engine has threads, every
millisecond the API server or the client spends is taken from an engine
thread, and an OpenMP region waits for its slowest thread: so the server's
TPOT is the offline step plus about twice their CPU per token. This runs
`pagoda serve` on a fresh server per round, drives it with `pagoda bench
serve`'s client in this process, and reads each process's CPU time
(user + system, children of the API server summed as the engine core)
before and after the measured run.

    python benchmarks/bench_server_cpu.py --rounds 3 --concurrency 1 --num-prompts 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import psutil
from pagoda.runtime.entrypoints.bench_serve import random_dataset, run_benchmark

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_process import ServerProcess, free_port, pagoda_serve_cmd

VOCAB = (100, 32000)


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def process_cpu(server: ServerProcess) -> dict[str, float]:
    """CPU seconds so far of the API server and of its children (the engine core)."""
    api = psutil.Process(server.proc.pid)
    t = api.cpu_times()
    return {
        "api_user": t.user,
        "api_sys": t.system,
        "api": cpu_seconds(api),
        "core": sum(cpu_seconds(c) for c in api.children(recursive=True)),
        "client": time.process_time(),
    }


def one_round(ns) -> dict:
    port = free_port()
    cmd = pagoda_serve_cmd(port, ns.model, "--dtype", ns.dtype, "--max-model-len", "1024",
                           "--kv-cache-memory", "1", "--max-num-seqs", str(max(ns.concurrency, 4)),
                           "--num-threads", str(ns.threads), *ns.pagoda_flags.split())  # fmt: skip
    server = ServerProcess("pagoda", cmd, port)
    try:
        warmup = random_dataset(4, 32, ns.output_len, 99, VOCAB, ns.input_len_max)
        asyncio.run(run_benchmark(server.url, warmup, max_concurrency=min(ns.concurrency, 4)))
        work = random_dataset(
            ns.num_prompts, ns.input_len, ns.output_len, 0, VOCAB, ns.input_len_max
        )
        before = process_cpu(server)
        out = asyncio.run(run_benchmark(server.url, work, max_concurrency=ns.concurrency))
        after = process_cpu(server)
    finally:
        server.stop()
    tokens = out["total_output_tokens"]
    row = {
        "output_tok_s": out["output_throughput"],
        "ttft_ms": out["ttft_s"]["mean"] * 1e3,
        "tpot_ms": out["tpot_s"]["mean"] * 1e3,
        "wall_s": out["duration_s"],
        "tokens": tokens,
    }
    for name in before:
        row[f"{name}_cpu_ms_per_token"] = (after[name] - before[name]) * 1e3 / tokens
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--input-len-max", type=int, default=512)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--pagoda-flags", default="", help="extra `pagoda serve` flags")
    p.add_argument("--label", default="", help="a name for this run in the result file")
    p.add_argument("--result-file", default=None, help="append the result (JSON lines)")
    ns = p.parse_args()

    rounds = []
    for r in range(ns.rounds):
        row = one_round(ns)
        rounds.append(row)
        print(f"round {r}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()), flush=True)
    summary = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print("medians: " + ", ".join(f"{k} {v:.3g}" for k, v in summary.items()))
    if ns.result_file:
        with open(ns.result_file, "a") as f:
            record = {"label": ns.label, "config": vars(ns), "median": summary, "rounds": rounds}
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
