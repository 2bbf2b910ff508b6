"""Where the engine's time goes, layer part by layer part (issue 13).

torch.profiler does not see the C++ CPU kernels (they are pybind calls, not
aten ops), so this wraps the model's own modules instead: each projection,
the attention layer (and inside it the backend's decode and prefill kernels
and the cache write), the norms, SiLU-and-mul, RoPE and the LM head, and
sums the wall time of each over `LLM.generate` of the peer benchmark's
seeded workload. A part's time includes its Python call overhead.

    python benchmarks/profile_layers.py --dtype bfloat16 --num-prompts 64 --max-num-seqs 16
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ns = ap.parse_args()
    torch.set_num_threads(ns.threads)
    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.attention import torch_backend
    from pagoda.runtime.entrypoints.bench_serve import random_dataset

    llm = LLM(
        dtype=ns.dtype,
        max_model_len=1024,
        kv_cache_memory_gib=1.0,
        max_num_seqs=ns.max_num_seqs,
        enable_prefix_caching=False,
    )
    model = llm.engine.engine_core.executor.worker.runner.model  # the in-process executor
    times: dict[str, float] = collections.defaultdict(float)
    timing = [False]

    def wrap(obj, attr: str, part: str) -> None:
        fn = getattr(obj, attr)

        def timed(*args, **kwargs):
            if not timing[0]:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times[part] += time.perf_counter() - start

        setattr(obj, attr, timed)

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
            wrap(module, "forward", part)
    wrap(model.model.layers[0].self_attn.rotary_emb, "forward", "rope")  # shared by all layers
    backend = model.model.layers[0].self_attn.attn.backend
    for attr, part in (
        ("decode_op", "  decode kernel"),
        ("prefill_op", "  prefill kernel"),
        ("cache_op", "  cache write"),
    ):
        if getattr(backend, attr, None) is not None:
            wrap(backend, attr, part)
    wrap(torch_backend, "write_kv_cache", "  cache write")
    wrap(model.model, "forward", "model forward")
    wrap(model, "compute_logits", "lm_head")

    reqs = random_dataset(ns.num_prompts, 32, 64, 0, (100, 32000), input_len_max=512)
    params = SamplingParams(temperature=0.0, max_tokens=64, min_tokens=64, ignore_eos=True)
    llm.generate([r.prompt_token_ids for r in reqs[:4]], params)  # warm-up
    timing[0] = True
    start = time.perf_counter()
    llm.generate([r.prompt_token_ids for r in reqs], params)
    wall = time.perf_counter() - start
    print(f"{ns.dtype}: wall {wall:.2f} s, {64 * len(reqs) / wall:.1f} output tok/s")
    for part, seconds in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"{part:16s} {seconds:7.3f} s {100 * seconds / wall:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
