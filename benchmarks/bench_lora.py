"""Multi-LoRA costs, in three numbers:

  unused     base-model throughput of an engine with `enable_lora` (4 slots,
             rank 8) that serves no adapter, against an engine without LoRA.
             Goal: < 3% slower.
  mixed      the same workload with every request on one of 4 adapters
             (round-robin), against the base model alone. Goal: >= 0.7.
  hot-load   from the `POST /v1/load_lora_adapter` call to the first response
             served by that adapter (one token), p50 and p99, on an idle
             server and on one serving base-model streams meanwhile; next
             to it, the same request sent again once the adapter is in.

The offline engines live in one process and the systems alternate across
rounds (this machine's speed drifts); medians are reported. Adapters are
random PEFT folders (rank 8 on all seven projections,
`pagoda.runtime.lora.random_adapter`).

    python benchmarks/bench_lora.py --out .bench/lora.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import Server, offline_throughput
from pagoda.runtime.lora.random_adapter import write_random_adapter
from workload import random_workload


def offline(args, adapter_dirs: list[Path]) -> dict:
    from pagoda.runtime import LLM, LoRARequest

    common = dict(max_model_len=1024, kv_cache_memory_gib=0.5, dtype=args.dtype)
    plain = LLM(**common)
    lora = LLM(**common, enable_lora=True, max_loras=4, max_lora_rank=args.rank)
    arch = plain.engine.model_config.arch
    reqs = random_workload(args.num_requests, (64, 128), (args.output_len,) * 2, arch.vocab_size)
    loras = [LoRARequest(f"a{i}", i + 1, str(d)) for i, d in enumerate(adapter_dirs)]
    mixed = [loras[i % len(loras)] for i in range(len(reqs))]

    def run_mixed() -> dict:
        # offline_throughput without adapters, inlined to pass lora_request.
        from pagoda.runtime.sampling_params import SamplingParams

        params = [
            SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in reqs
        ]
        start = time.perf_counter()
        outs = lora.generate([r.prompt_token_ids for r in reqs], params, lora_request=mixed)
        duration = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        return {"output_throughput": tokens / duration}

    systems = {
        "disabled": lambda: offline_throughput(plain, reqs),
        "enabled_unused": lambda: offline_throughput(lora, reqs),
        "mixed_4_adapters": run_mixed,
    }
    for run in systems.values():  # warm-up: oneDNN primitives, adapters into host memory
        run()
    rates: dict[str, list[float]] = {name: [] for name in systems}
    for r in range(args.rounds):
        order = list(systems) if r % 2 == 0 else list(reversed(systems))
        for name in order:
            rates[name].append(systems[name]()["output_throughput"])
            print(f"round {r} {name}: {rates[name][-1]:.1f} tok/s", flush=True)
    med = {name: statistics.median(v) for name, v in rates.items()}
    return {
        "rounds": rates,
        "median_tok_s": med,
        "unused_over_disabled": med["enabled_unused"] / med["disabled"],
        "mixed_over_disabled": med["mixed_4_adapters"] / med["disabled"],
        "mixed_over_unused": med["mixed_4_adapters"] / med["enabled_unused"],
    }


async def hot_load(args, adapter_dirs: list[Path]) -> dict:
    import httpx

    server = Server(
        [
            "--enable-lora",
            "--max-loras",
            "2",
            "--max-lora-rank",
            str(args.rank),
            "--max-cpu-loras",
            "4",
            "--dtype",
            args.dtype,
        ],
        ["--served-model-name", "base"],
    )
    results: dict[str, dict] = {}
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
            stop = asyncio.Event()

            async def background() -> None:
                body = {"model": "base", "prompt": "Tell me a story.", "max_tokens": 64}
                while not stop.is_set():
                    await client.post("/v1/completions", json=body)

            for mode in ("idle", "busy"):
                streams = (
                    [asyncio.ensure_future(background()) for _ in range(4)]
                    if mode == "busy"
                    else []
                )
                await asyncio.sleep(0.5 if streams else 0)
                first, load_only, again = [], [], []
                for i in range(args.hot_loads):
                    name = f"{mode}{i}"
                    folder = str(adapter_dirs[i % len(adapter_dirs)])
                    t0 = time.perf_counter()
                    resp = await client.post(
                        "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": folder}
                    )
                    resp.raise_for_status()
                    t1 = time.perf_counter()
                    body = {"model": name, "prompt": "Hello", "max_tokens": 1}
                    (await client.post("/v1/completions", json=body)).raise_for_status()
                    first.append(time.perf_counter() - t0)
                    load_only.append(t1 - t0)
                    # The same request once the adapter is in: what the
                    # first one cost beyond this is the hot-load's.
                    t2 = time.perf_counter()
                    (await client.post("/v1/completions", json=body)).raise_for_status()
                    again.append(time.perf_counter() - t2)
                    await client.post("/v1/unload_lora_adapter", json={"lora_name": name})
                stop.set()
                await asyncio.gather(*streams)
                stop.clear()
                results[mode] = {
                    "load_to_first_response_ms": _percentiles(first),
                    "load_call_ms": _percentiles(load_only),
                    "next_request_ms": _percentiles(again),
                }
                print(mode, json.dumps(results[mode]), flush=True)
    finally:
        server.stop()
    return results


def _percentiles(seconds: list[float]) -> dict:
    ms = sorted(s * 1000 for s in seconds)
    return {
        "p50": statistics.median(ms),
        "p99": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))],
        "n": len(ms),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hot-loads", type=int, default=40)
    parser.add_argument("--skip-offline", action="store_true")
    parser.add_argument("--skip-hot-load", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from pagoda.runtime.model_loader.builtin import resolve_builtin
    from pagoda.runtime.model_loader.gguf_loader import read_gguf_config

    arch = read_gguf_config(resolve_builtin("smollm2-135m-instruct"))
    with tempfile.TemporaryDirectory(prefix="pagoda-lora-bench-") as tmp:
        dirs = [write_random_adapter(Path(tmp) / f"a{i}", arch, args.rank, i) for i in range(4)]
        result: dict = {"args": vars(args) | {"out": str(args.out)}}
        if not args.skip_offline:
            result["offline"] = offline(args, dirs)
        if not args.skip_hot_load:
            result["hot_load"] = asyncio.run(hot_load(args, dirs))
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
