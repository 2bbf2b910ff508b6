"""Scheduler + KV cache manager CPU cost per step, with no model.

A stand-in runner returns one fixed token id for every request that reached
the end of its tokens, so what is timed is only `Scheduler.schedule()` plus
`Scheduler.update_from_output()`: the engine core's own overhead per step, in
decode steady state (every request running, none finishing).

    .venv/bin/python benchmarks/bench_scheduler.py [--out .bench/scheduler.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time
from pathlib import Path

from pagoda.runtime.config import CacheConfig, SchedulerConfig
from pagoda.runtime.core.request import Request
from pagoda.runtime.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.sampling_params import SamplingParams

FIXED_TOKEN = 42


def stand_in_runner(out: SchedulerOutput, scheduler: Scheduler) -> ModelRunnerOutput:
    """Samples FIXED_TOKEN for each request whose known tokens are all computed."""
    requests = scheduler.requests
    sampled = {}
    for req_id in out.num_scheduled_tokens:
        request = requests[req_id]
        if request.num_computed_tokens == request.num_tokens:
            sampled[req_id] = [FIXED_TOKEN]
    return ModelRunnerOutput(sampled_token_ids=sampled)


def build(num_reqs: int, steps: int, block_size: int, seed: int, freeze: bool) -> Scheduler:
    rng = random.Random(seed)
    prompt_lens = [rng.randint(200, 400) for _ in range(num_reqs)]
    max_model_len = 4096
    max_tokens = steps * 2 + 64  # nothing finishes while we time
    blocks_per_req = -(-(max(prompt_lens) + max_tokens) // block_size)
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_seqs=num_reqs,
            max_num_batched_tokens=max(8192, num_reqs),
            max_model_len=max_model_len,
        ),
        CacheConfig(block_size=block_size),
        num_blocks=num_reqs * blocks_per_req + 64,
    )
    if freeze:
        # What an engine does once at start-up (vLLM does too): move the
        # block pool's long-lived objects out of the collector's reach, so
        # full collections stop traversing tens of thousands of blocks.
        gc.collect()
        gc.freeze()
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for i, n in enumerate(prompt_lens):
        prompt = [rng.randrange(32000) for _ in range(n)]
        scheduler.add_request(Request(f"req-{i}", prompt, params, 2, max_model_len))
    return scheduler


def warm_up(scheduler: Scheduler) -> int:
    """Step until every request has finished its prefill and decodes."""
    steps = 0
    while True:
        out = scheduler.schedule()
        scheduler.update_from_output(out, stand_in_runner(out, scheduler))
        steps += 1
        if (
            not scheduler.waiting
            and all(n == 1 for n in out.num_scheduled_tokens.values())
            and len(out.num_scheduled_tokens) == len(scheduler.running)
        ):
            return steps


def measure(num_reqs: int, steps: int, block_size: int, seed: int, freeze: bool) -> dict:
    scheduler = build(num_reqs, steps, block_size, seed, freeze)
    warmup_steps = warm_up(scheduler)
    gc.collect()
    schedule_us, update_us, total_us = [], [], []
    clock = time.perf_counter_ns
    for _ in range(steps):
        t0 = clock()
        out = scheduler.schedule()
        t1 = clock()
        runner_output = stand_in_runner(out, scheduler)
        t2 = clock()
        scheduler.update_from_output(out, runner_output)
        t3 = clock()
        assert len(out.num_scheduled_tokens) == num_reqs
        schedule_us.append((t1 - t0) / 1e3)
        update_us.append((t3 - t2) / 1e3)
        total_us.append((t1 - t0 + t3 - t2) / 1e3)
    gc.unfreeze()
    return {
        "num_running": num_reqs,
        "gc": "freeze" if freeze else "default",
        "num_blocks": scheduler.kv_cache_manager.num_blocks,
        "steps": steps,
        "warmup_steps": warmup_steps,
        "median_us": statistics.median(total_us),
        "p90_us": percentile(total_us, 0.9),
        "max_us": max(total_us),
        "schedule_median_us": statistics.median(schedule_us),
        "update_median_us": statistics.median(update_us),
        "per_request_median_us": statistics.median(total_us) / num_reqs,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".bench/scheduler.json")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    results = [
        measure(n, args.steps, args.block_size, args.seed, freeze)
        for freeze in (False, True)
        for n in args.sizes
    ]
    print(
        f"{'running':>8} {'gc':>8} {'median us':>10} {'p90 us':>10} {'max us':>9} "
        f"{'schedule':>9} {'update':>9} {'us/req':>7}"
    )
    for r in results:
        print(
            f"{r['num_running']:>8} {r['gc']:>8} {r['median_us']:>10.1f} {r['p90_us']:>10.1f} "
            f"{r['max_us']:>9.0f} {r['schedule_median_us']:>9.1f} {r['update_median_us']:>9.1f} "
            f"{r['per_request_median_us']:>7.2f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "steps": args.steps,
        "block_size": args.block_size,
        "prompt_len": "200-400",
        # Other work on the machine shows up as multi-ms steps in the tail.
        "loadavg_1m_after": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
    }
    out.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
