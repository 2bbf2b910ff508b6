"""Pagoda against llama.cpp's llama-server on this machine, side by side,
with one client (`pagoda bench serve`'s) for both.

Per round, for each dtype and concurrency, both systems run the same seeded
workload on a freshly started server, in alternating order (round r starts
with Pagoda when r is even); each server gets a short warm-up on other
prompts first. Medians over rounds are reported.

  random workload   --num-prompts completions (fewer at concurrency 1:
                    --num-prompts-c1; means per request do not need more),
                    prompts of 32-512 random token ids, exactly 64 output
                    tokens each (ignore_eos), streaming
  shared prefix     32 requests sharing one 384-token system prompt plus
                    32-128-token suffixes, concurrency 4: Pagoda with prefix
                    caching on, off, and llama-server (its own prompt cache)
  offline           `LLM.generate` on the concurrency-16 workload, in a
                    fresh process, for the server/offline ratio

llama-server is built by `build_llama_server.sh` and runs the F32 or BF16
GGUF that `convert_gguf.py` writes from the built-in model, i.e. exactly the
weights Pagoda runs. Both get --threads threads (llama-server `-t`/`-tb`; the
engine core `--num-threads`) and as many slots/sequences as the concurrency.

    python benchmarks/peers/bench_vs_llama_server.py --rounds 3
    python benchmarks/peers/bench_vs_llama_server.py --rounds 1 --dtypes bfloat16 \
        --concurrency 1 --no-shared-prefix --no-offline        # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pagoda.runtime.entrypoints.bench_serve import (
    random_dataset,
    run_benchmark,
    shared_prefix_dataset,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from convert_gguf import converted, default_cache  # noqa: E402

sys.path.insert(0, str(HERE.parent))
from server_process import ServerProcess, free_port, pagoda_serve_cmd  # noqa: E402

VOCAB = (100, 32000)
GGUF_KIND = {"float32": "F32", "bfloat16": "BF16"}


def pagoda_server(dtype: str, concurrency: int, ns, extra: list[str]) -> ServerProcess:
    port = free_port()
    cmd = pagoda_serve_cmd(port, ns.model, "--dtype", dtype, "--max-model-len", "1024",
                           "--kv-cache-memory", "1", "--max-num-seqs", str(max(concurrency, 4)),
                           *ns.pagoda_flags.split(), *extra)  # fmt: skip
    if ns.threads:
        cmd += ["--num-threads", str(ns.threads)]
    return ServerProcess("pagoda", cmd, port)


def llama_server(dtype: str, concurrency: int, ns) -> ServerProcess:
    port = free_port()
    gguf = converted(ns.cache, GGUF_KIND[dtype])
    threads = str(ns.threads or os.cpu_count())
    cmd = [ns.llama_server, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "-t", threads, "-tb", threads, "-np", str(concurrency),
           "-c", str(1024 * concurrency), "--no-webui"]  # fmt: skip
    return ServerProcess("llama-server", cmd, port)


def bench(server: ServerProcess, requests, concurrency: int, warmup) -> dict:
    asyncio.run(run_benchmark(server.url, warmup, max_concurrency=min(concurrency, 4)))
    out = asyncio.run(run_benchmark(server.url, requests, max_concurrency=concurrency))
    if out["failed"]:
        raise RuntimeError(f"{server.name}: {out['failed']} failed requests: {out['errors']}")
    return out


def offline(dtype: str, requests, ns) -> dict:
    """LLM.generate on `requests` in a fresh process (no server running)."""
    payload = json.dumps(
        {
            "dtype": dtype,
            "model": ns.model,
            "threads": ns.threads,
            "prompts": [r.prompt_token_ids for r in requests],
            "output_len": requests[0].output_len,
            "flags": ns.offline_flags,
        }
    )
    proc = subprocess.run(
        [sys.executable, str(Path(__file__)), "--offline-worker"],
        input=payload,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _offline_worker() -> int:
    job = json.loads(sys.stdin.read())
    import torch

    if job["threads"]:
        torch.set_num_threads(job["threads"])
    from pagoda.runtime import LLM, SamplingParams

    llm = LLM(
        job["model"],
        dtype=job["dtype"],
        max_model_len=1024,
        kv_cache_memory_gib=1.0,
        max_num_seqs=16,
        enable_prefix_caching=False,
        **json.loads(job["flags"]),
    )
    n = job["output_len"]
    params = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)
    llm.generate([list(range(300, 300 + 64))] * 2, params)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(job["prompts"], params)
    duration = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(json.dumps({"duration_s": duration, "output_throughput": tokens / duration}))
    return 0


def row(summary: dict) -> dict:
    out = {
        "output_throughput": summary["output_throughput"],
        "ttft_mean_ms": summary["ttft_s"]["mean"] * 1e3,
        "tpot_mean_ms": summary["tpot_s"]["mean"] * 1e3,
        "duration_s": summary["duration_s"],
    }
    # Pagoda's own split of TTFT (llama-server exposes none): the time its
    # requests waited for a step, and the time their prefill took.
    for key in ("queue", "prefill"):
        if f"{key}_mean" in summary.get("server_s", {}):
            out[f"server_{key}_mean_ms"] = summary["server_s"][f"{key}_mean"] * 1e3
    return out


def main() -> int:
    if "--offline-worker" in sys.argv:
        return _offline_worker()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 1])
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--num-prompts-c1", type=int, default=16)
    p.add_argument("--threads", type=int, default=None, help="default: each system's own")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--pagoda-flags", default="", help="extra `pagoda serve` flags")
    p.add_argument("--offline-flags", default="{}", help="extra LLM options, JSON")
    p.add_argument("--no-shared-prefix", dest="shared_prefix", action="store_false")
    p.add_argument("--no-offline", dest="offline", action="store_false")
    p.add_argument("--prefix-dtype", default="bfloat16")
    # llama-server's cache is f16 whatever the weights (its -ctk/-ctv default);
    # pagoda's follows the model unless told (--kv-cache-dtype).
    p.add_argument(
        "--kv-cache-dtypes",
        nargs="+",
        default=["auto"],
        help="pagoda's --kv-cache-dtype, each a system of its own (auto: `pagoda`, "
        "others: `pagoda-kv-<dtype>`)",
    )
    p.add_argument("--prefix-kv-cache-dtype", default="auto")
    p.add_argument("--cache", type=Path, default=default_cache())
    p.add_argument("--llama-server", default=None, help="default: build_llama_server.sh")
    p.add_argument("--result-file", default=".bench/peers.json")
    ns = p.parse_args()
    if ns.llama_server is None:
        ns.llama_server = subprocess.run(
            ["bash", str(HERE / "build_llama_server.sh")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    warmup = random_dataset(4, 32, 16, 99, VOCAB, 128)
    workloads = {
        c: random_dataset(
            ns.num_prompts if c > 1 else ns.num_prompts_c1, 32, 64, 0, VOCAB, input_len_max=512
        )
        for c in ns.concurrency
    }
    shared = shared_prefix_dataset(32, 384, 32, 64, 1, 1, VOCAB, suffix_len_max=128)
    results: list[dict] = []
    # System name -> pagoda's --kv-cache-dtype.
    pagoda_kv = {"pagoda" if kv == "auto" else f"pagoda-kv-{kv}": kv for kv in ns.kv_cache_dtypes}

    def record(rnd, dtype, conc, system, data):
        results.append(
            {"round": rnd, "dtype": dtype, "concurrency": conc, "system": system, **data}
        )
        print(
            f"round {rnd} {dtype:9} c={conc:<3} {system:22} "
            + " ".join(f"{k} {v:.1f}" for k, v in data.items()),
            flush=True,
        )

    for rnd in range(ns.rounds):
        for dtype in ns.dtypes:
            for conc in ns.concurrency:
                systems = [*pagoda_kv, "llama-server"]
                if rnd % 2:
                    systems.reverse()
                for system in systems:
                    server = (
                        llama_server(dtype, conc, ns)
                        if system == "llama-server"
                        else pagoda_server(dtype, conc, ns, ["--kv-cache-dtype", pagoda_kv[system]])
                    )
                    try:
                        record(
                            rnd,
                            dtype,
                            conc,
                            system,
                            row(bench(server, workloads[conc], conc, warmup)),
                        )
                    finally:
                        server.stop()
            if ns.offline and 16 in workloads:
                record(rnd, dtype, 16, "offline", offline(dtype, workloads[16], ns))
        if ns.shared_prefix:
            dtype = ns.prefix_dtype
            order = ["on", "off", "llama-server"]
            if rnd % 2:
                order.reverse()
            for system in order:
                if system == "llama-server":
                    server = llama_server(dtype, 4, ns)
                else:
                    flag = (
                        "--enable-prefix-caching"
                        if system == "on"
                        else "--no-enable-prefix-caching"
                    )
                    kv = ["--kv-cache-dtype", ns.prefix_kv_cache_dtype]
                    server = pagoda_server(dtype, 4, ns, [flag, *kv])
                name = system if system == "llama-server" else f"pagoda-prefix-{system}"
                try:
                    record(rnd, dtype, 4, f"shared:{name}", row(bench(server, shared, 4, warmup)))
                finally:
                    server.stop()

    summary = summarize(results)
    print_summary(summary)
    Path(ns.result_file).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.result_file).write_text(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "load_average_end": os.getloadavg(),
                "config": {k: str(v) for k, v in vars(ns).items()},
                "summary": summary,
                "runs": results,
            },
            indent=2,
        )
    )
    return 0


def summarize(results: list[dict]) -> list[dict]:
    keys = sorted({(r["dtype"], r["concurrency"], r["system"]) for r in results})
    out = []
    for dtype, conc, system in keys:
        runs = [
            r
            for r in results
            if (r["dtype"], r["concurrency"], r["system"]) == (dtype, conc, system)
        ]
        med = {
            k: statistics.median(r[k] for r in runs)
            for k in runs[0]
            if k not in ("round", "dtype", "concurrency", "system") and all(k in r for r in runs)
        }
        out.append(
            {"dtype": dtype, "concurrency": conc, "system": system, "rounds": len(runs), **med}
        )
    return out


def print_summary(summary: list[dict]) -> None:
    print(
        "\n| dtype | concurrency | system | output tok/s | mean TTFT ms | mean TPOT ms "
        "| server queue + prefill ms |"
    )
    print("|---|---:|---|---:|---:|---:|---:|")
    for s in summary:
        split = (
            f"{s['server_queue_mean_ms']:.0f} + {s['server_prefill_mean_ms']:.0f}"
            if "server_prefill_mean_ms" in s
            else ""
        )
        print(
            f"| {s['dtype']} | {s['concurrency']} | {s['system']} | {s['output_throughput']:.1f} "
            f"| {s.get('ttft_mean_ms', float('nan')):.0f} | {s.get('tpot_mean_ms', float('nan')):.1f} "
            f"| {split} |"
        )
    by = {(s["dtype"], s["concurrency"], s["system"]): s for s in summary}
    for (dtype, conc, system), s in by.items():
        peer = by.get((dtype, conc, "llama-server"))
        if system.startswith("pagoda") and peer:
            print(
                f"{dtype} c={conc}: {system}/llama-server tok/s {s['output_throughput'] / peer['output_throughput']:.2f}, "
                f"TPOT {s['tpot_mean_ms'] / peer['tpot_mean_ms']:.2f}, TTFT {s['ttft_mean_ms'] / peer['ttft_mean_ms']:.2f}"
            )
        off = by.get((dtype, conc, "offline"))
        if system == "pagoda" and off:
            print(
                f"{dtype} c={conc}: server/offline {s['output_throughput'] / off['output_throughput']:.2f}"
            )


if __name__ == "__main__":
    sys.exit(main())
