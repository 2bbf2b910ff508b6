"""torch.profiler over the engine on the peer benchmark's workload (issue 13).

Runs `LLM.generate` (the same EngineCore, scheduler, model runner and model
as the server, without the HTTP and ZMQ hops) on the seeded workload of
`benchmarks/peers/bench_vs_llama_server.py` at 16 sequences per step, and
prints the top operators by self CPU time, so docs/benchmarks.md can list
where the time goes before and after a change.

    python benchmarks/profile_engine.py --dtype bfloat16 --num-prompts 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--engine-args", default="{}", help="JSON of extra LLM options")
    ns = ap.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.entrypoints.bench_serve import random_dataset

    reqs = random_dataset(ns.num_prompts, 32, 64, 0, (100, 32000), input_len_max=512)
    llm = LLM(
        dtype=ns.dtype,
        max_model_len=1024,
        kv_cache_memory_gib=1.0,
        max_num_seqs=ns.max_num_seqs,
        enable_prefix_caching=False,
        **json.loads(ns.engine_args),
    )
    params = SamplingParams(temperature=0.0, max_tokens=64, min_tokens=64, ignore_eos=True)
    llm.generate([r.prompt_token_ids for r in reqs[:4]], params)  # warm-up
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate([r.prompt_token_ids for r in reqs], params)
    wall = time.perf_counter() - start
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=ns.rows))
    tokens = 64 * len(reqs)
    print(f"wall {wall:.1f} s under the profiler, {tokens / wall:.1f} output tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
