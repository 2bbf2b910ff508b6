"""Where a decode step's time goes, phase by phase.

Runs the offline engine on B requests (short random prompts, a fixed number
of output tokens, greedy, ignore_eos) and times every decode-only step by
phase, wrapping the engine's own methods:

  schedule   Scheduler.schedule()
  prep       ModelRunner._update_batch + _prepare_inputs (persistent batch,
             flattened inputs, attention metadata)
  forward    the model's forward (embedding, layers, final norm), or the
             replay of a decode graph where one was captured
  lm_head    compute_logits of the sampled rows
  sample     sampling metadata + the sampler
  update     Scheduler.update_from_output()
  frontend   the rest of LLMEngine.step() (detokenization, outputs)

IPC (the server's ZMQ hop and the API process) is not in the offline engine:
compare with `pagoda bench serve`'s TPOT for that.

    python benchmarks/bench_step_phases.py --batch 1 16 --dtype float32 bfloat16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

PHASES = ("schedule", "prep", "forward", "lm_head", "sample", "update", "frontend", "total")


def _wrap(obj, name: str, phase: str, times: dict) -> None:
    fn = getattr(obj, name)

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            times[phase] += time.perf_counter() - t

    setattr(obj, name, timed)


def measure(llm, batch: int, prompt_len: int, output_len: int, seed: int) -> dict:
    import random

    from pagoda.runtime import SamplingParams

    engine = llm.engine
    core = engine.engine_core
    runner = core.executor.worker.runner
    times: dict = defaultdict(float)
    _wrap(core.scheduler, "schedule", "schedule", times)
    _wrap(core.scheduler, "update_from_output", "update", times)
    _wrap(runner, "_update_batch", "prep", times)
    _wrap(runner, "_prepare_inputs", "prep", times)
    model = runner.model
    _wrap(model, "forward", "forward", times)
    if runner.graph_runner is not None:  # a decode step replays a graph instead
        _wrap(runner.graph_runner, "run", "forward", times)
    _wrap(model, "compute_logits", "lm_head", times)
    _wrap(runner, "_sampling_metadata", "sample", times)
    _wrap(runner.sampler, "forward", "sample", times)

    rng = random.Random(seed)
    params = SamplingParams(
        temperature=0.0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True
    )
    for _ in range(batch):
        prompt = [rng.randrange(256, 49152) for _ in range(prompt_len)]
        engine.add_request(engine.next_request_id(), prompt, params)
    steps = []
    while engine.has_unfinished_requests():
        times.clear()
        sched = core.scheduler
        t = time.perf_counter()
        engine.step()
        times["total"] = time.perf_counter() - t
        decode_only = (
            all(r.num_computed_tokens >= r.num_prompt_tokens for r in sched.running)
            and len(sched.running) == batch
        )
        if decode_only:
            steps.append(dict(times))
    steps = steps[3:]  # the first decode steps warm caches and allocators
    out = {}
    for phase in PHASES:
        vals = [s.get(phase, 0.0) for s in steps]
        out[phase] = statistics.median(vals) * 1e3
    accounted = sum(out[p] for p in PHASES if p not in ("frontend", "total"))
    out["frontend"] = max(0.0, out["total"] - accounted)
    out["steps"] = len(steps)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--engine-args", default="{}", help="JSON of extra LLM options")
    ap.add_argument("--out", default=".bench/step_phases.json")
    ns = ap.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    from pagoda.runtime import LLM

    results = []
    for dtype in ns.dtype:
        extra = json.loads(ns.engine_args)
        for batch in ns.batch:
            llm = LLM(
                dtype=dtype,
                max_model_len=1024,
                kv_cache_memory_gib=1.0,
                max_num_seqs=max(ns.batch),
                enable_prefix_caching=False,
                **extra,
            )
            measure(llm, batch, ns.prompt_len, 8, 1)  # warm-up
            r = measure(llm, batch, ns.prompt_len, ns.output_len, 0)
            r.update(dtype=dtype, batch=batch)
            results.append(r)
            print(
                f"{dtype:9} B={batch:<3} "
                + " ".join(f"{p} {r[p]:.2f}" for p in PHASES)
                + f" ms (median of {r['steps']} decode steps)",
                flush=True,
            )
            llm.engine.shutdown()
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
