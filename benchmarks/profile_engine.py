"""Where the engine's time goes on the peer benchmark's workload.

Runs `LLM.generate` (the same EngineCore, scheduler, model runner and model
as the server, without the HTTP and ZMQ hops) on the seeded workload of
`benchmarks/peers/bench_vs_llama_server.py` at 16 sequences per step, and
prints either

- the top torch operators by self CPU time (torch.profiler), or, with
  `--by-layer`,
- the wall time of each part of the layers: each projection, the attention
  layer (and inside it the backend's decode and prefill kernels and the
  cache write), the norms, SiLU-and-mul, RoPE and the LM head. torch.profiler
  does not see the C++ CPU kernels (pybind calls, not aten ops): this wraps
  the model's own modules instead, so a part's time includes its Python
  call overhead.

    python benchmarks/profile_engine.py --dtype bfloat16 --num-prompts 32
    python benchmarks/profile_engine.py --dtype bfloat16 --num-prompts 64 --by-layer
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step_phases import _wrap


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--engine-args", default="{}", help="JSON of extra LLM options")
    ap.add_argument("--by-layer", action="store_true", help="time each part of the layers")
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
        # A replayed decode graph runs no module's forward: the by-layer
        # timing wraps them, so it needs the eager path.
        enforce_eager=ns.by_layer,
        **json.loads(ns.engine_args),
    )
    params = SamplingParams(temperature=0.0, max_tokens=64, min_tokens=64, ignore_eos=True)
    llm.generate([r.prompt_token_ids for r in reqs[:4]], params)  # warm-up
    if ns.by_layer:
        return by_layer(llm, [r.prompt_token_ids for r in reqs], params)
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate([r.prompt_token_ids for r in reqs], params)
    wall = time.perf_counter() - start
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=ns.rows))
    tokens = 64 * len(reqs)
    print(f"wall {wall:.1f} s under the profiler, {tokens / wall:.1f} output tok/s")
    return 0


def by_layer(llm, prompts: list[list[int]], params) -> int:
    """Run `prompts` with every part of the layers timed; print the sums."""
    model = llm.engine.engine_core.executor.worker.runner.model  # the in-process executor
    times: dict[str, float] = defaultdict(float)
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for module, part in (
            (attn.qkv_proj, "qkv_proj"),
            (attn.o_proj, "o_proj"),
            (attn.attn, "attention"),
            (mlp.gate_up_proj, "gate_up_proj"),
            (mlp.down_proj, "down_proj"),
            (mlp.act_fn, "silu_and_mul"),
            (layer.input_layernorm, "rms_norm"),
            (layer.post_attention_layernorm, "rms_norm"),
        ):
            _wrap(module, "forward", part, times)
    _wrap(model.model.layers[0].self_attn.rotary_emb, "forward", "rope", times)  # shared
    backend = model.model.layers[0].self_attn.attn.backend
    for attr, part in (
        ("decode_op", "  decode kernel"),
        ("prefill_op", "  prefill kernel"),
        ("cache_op", "  cache write"),
    ):
        if getattr(backend, attr, None) is not None:
            _wrap(backend, attr, part, times)
    _wrap(model.model, "forward", "model forward", times)
    _wrap(model, "compute_logits", "lm_head", times)
    start = time.perf_counter()
    llm.generate(prompts, params)
    wall = time.perf_counter() - start
    print(f"wall {wall:.2f} s, {params.max_tokens * len(prompts) / wall:.1f} output tok/s")
    for part, seconds in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"{part:16s} {seconds:7.3f} s {100 * seconds / wall:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
