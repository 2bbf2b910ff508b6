"""The C++ CPU kernels against the torch twins, inside the engine.

Runs `LLM.generate` on B prompts of the same length (greedy, ignore_eos, a
fixed number of output tokens) and alternates, round after round in one
process, between four settings on the same model, KV cache and batches:

  torch      the torch twins, the torch decode attention and SDPA prefills
  decode     + the C++ decode attention kernel
  layerops   + the C++ RMSNorm and RoPE
  all        + the C++ prefill attention kernel (the default)

Reports per setting the medians of the wall time and of the time spent in
the attention backend (prefill chunks included), and whether each setting
produced the torch setting's tokens.

    python benchmarks/bench_cpu_kernels.py --batch 1 16 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=".bench/cpu_kernels.json")
    ns = ap.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.attention.torch_backend import TorchAttentionBackend
    from pagoda.runtime.layers.custom_op import set_cpu_kernels

    llm = LLM(
        dtype=ns.dtype,
        max_model_len=2048,
        kv_cache_memory_gib=1.0,
        max_num_seqs=max(ns.batch),
        enable_prefix_caching=False,
        # The settings swap kernels under a loaded model: a recorded decode
        # graph would keep replaying the kernels it was captured with.
        enforce_eager=True,
    )
    runner = llm.engine.engine_core.executor.worker.runner
    backend = runner.backend
    assert isinstance(backend, TorchAttentionBackend), "the CPU engine runs the torch backend"
    decode_kernel, prefill_kernel = backend.decode_op, backend.prefill_op
    if decode_kernel is None or prefill_kernel is None:
        print("the C++ kernels did not build: nothing to compare", file=sys.stderr)
        return 1
    spent = [0.0]
    forward = backend.forward

    def timed_forward(*args):
        start = time.perf_counter()
        out = forward(*args)
        spent[0] += time.perf_counter() - start
        return out

    backend.forward = timed_forward
    params = SamplingParams(
        temperature=0.0, max_tokens=ns.output_len, min_tokens=ns.output_len, ignore_eos=True
    )
    results = []
    for batch in ns.batch:
        prompts = [[100 + i + j for i in range(ns.prompt_len)] for j in range(batch)]
        settings = ("torch", "decode", "layerops", "all")
        wall: dict[str, list[float]] = {k: [] for k in settings}
        attn: dict[str, list[float]] = {k: [] for k in settings}
        tokens = {}
        for _ in range(ns.rounds):
            for name in settings:
                backend.decode_op = decode_kernel if name != "torch" else None
                backend.prefill_op = prefill_kernel if name == "all" else None
                backend._plan_for = None  # re-plan for the other path
                set_cpu_kernels(runner.model, name in ("layerops", "all"))
                spent[0] = 0.0
                start = time.perf_counter()
                outs = llm.generate(prompts, params)
                wall[name].append(time.perf_counter() - start)
                attn[name].append(spent[0])
                tokens[name] = [o.outputs[0].token_ids for o in outs]
        for name in settings:
            row = {
                "batch": batch,
                "dtype": ns.dtype,
                "setting": name,
                "wall_s": statistics.median(wall[name]),
                "attention_s": statistics.median(attn[name]),
                "steps": ns.output_len,
                "same_tokens_as_torch": tokens[name] == tokens["torch"],
            }
            results.append(row)
            print(
                f"B={batch:<3} {name:<9} wall {row['wall_s']:.3f} s"
                f" ({row['wall_s'] / ns.output_len * 1e3:.1f} ms per step incl. prefill)"
                f" | attention {row['attention_s']:.3f} s"
                f" | same tokens as torch {row['same_tokens_as_torch']}"
            )
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
