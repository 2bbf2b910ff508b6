"""End-to-end decode on a GPU: Pagoda against transformers on a
Llama-3-8B-shaped model with random bf16 (or --dtype float16) weights, and each step against the
memory roofline.

For every batch size B: B requests with prompts of --prompt-len random
token ids each generate exactly --output-len tokens (greedy, EOS ignored).

  pagoda-graphs   the engine with CUDA graphs (the default on CUDA)
  pagoda-eager    the same engine with --enforce-eager (batch 1 only by
                  default, to show what graphs save)
  hf              transformers `generate` on the same model shape and batch

Reported: output tokens/s (whole request, prefill included; the median of
--repeats runs) and the median
decode step time (decode-only steps, timed around the model runner with the
device synchronised), against the roofline: weight bytes (of an untied
embedding table only the step's rows) + KV bytes read in the step over the
measured device copy bandwidth.

    python benchmarks/bench_decode_e2e.py                 # B = 1 16 64 256
    python benchmarks/bench_decode_e2e.py --batch 1 64 --output-len 64
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "kernels"))
from bench_decode_attention import measure_copy_bandwidth


class StepTimer:
    """Wraps ModelRunner.execute_model to time decode-only steps."""

    def __init__(self, runner):
        self.runner = runner
        self.inner = runner.execute_model
        self.decode_times: list[tuple[int, int, float]] = []  # (batch, kv tokens, seconds)
        runner.execute_model = self

    def __call__(self, so):
        decode = so.total_num_scheduled_tokens == len(so.num_scheduled_tokens) > 0
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = self.inner(so)
        torch.cuda.synchronize()
        if decode:
            kv = sum(
                self.runner.batch.num_tokens[self.runner.batch.index[r]]
                for r in so.num_scheduled_tokens
            )
            self.decode_times.append(
                (len(so.num_scheduled_tokens), int(kv), time.perf_counter() - t)
            )
        return out


def run_pagoda(llm, prompts, output_len) -> float:
    from pagoda.runtime import SamplingParams

    params = SamplingParams(
        temperature=0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True
    )
    torch.cuda.synchronize()
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t
    assert all(len(o.outputs[0].token_ids) == output_len for o in outs)
    return elapsed


@torch.inference_mode()
def run_hf(model, prompts, output_len) -> float:
    ids = torch.tensor(prompts, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=output_len,
        min_new_tokens=output_len,
        do_sample=False,
        pad_token_id=0,
    )
    torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + output_len
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--eager-batches", type=int, nargs="*", default=[1])
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.45)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument(
        "--repeats", type=int, default=3, help="timed runs per batch; tokens/s is their median"
    )
    ap.add_argument("--out", default="benchmarks/results/decode_e2e.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_decode_e2e needs a CUDA device (none found); nothing measured")

    from pagoda.runtime import LLM
    from pagoda.runtime.model_loader.random_loader import PRESETS

    bw = measure_copy_bandwidth()
    max_b = max(args.batch)
    common = dict(
        model=args.preset,
        random_weights=True,
        dtype=args.dtype,
        max_model_len=args.prompt_len + args.output_len + 16,
        max_num_seqs=max_b,
        max_num_batched_tokens=max(8192, args.prompt_len * 8),
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    g = torch.Generator().manual_seed(0)
    vocab = PRESETS[args.preset]["vocab_size"]
    results = {
        "device": torch.cuda.get_device_name(),
        "dtype": args.dtype,
        "copy_bandwidth_GBps": bw / 1e9,
        "rows": [],
    }

    llm = LLM(**common)
    runner = llm.engine.engine_core.executor.worker.runner
    weight_bytes = runner.weight_bytes
    # A step reads only its B rows of an untied embedding table, not all of
    # it (1 GB of Llama-3-8B's 16): the roofline counts what must be read.
    embed = runner.model.model.embed_tokens.weight
    tied = runner.model.lm_head.weight.data_ptr() == embed.data_ptr()
    embed_bytes = 0 if tied else embed.numel() * embed.element_size()
    row_bytes = embed.shape[1] * embed.element_size()
    kv_bytes_per_token = runner.kv_bytes_per_block() // runner.cache_config.block_size
    timer = StepTimer(runner)

    hf = None
    if not args.no_hf:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(**{k: v for k, v in PRESETS[args.preset].items() if k != "architectures"})
        # Built in the half dtype directly: a float32 build of 8B weights
        # (32 GB) beside the engine's share of the GPU would not fit an 80 GB card.
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, args.dtype))
        try:
            with torch.device("cuda"):
                hf = LlamaForCausalLM(cfg).eval()
        finally:
            torch.set_default_dtype(default_dtype)

    for b in args.batch:
        prompts = torch.randint(256, vocab, (b, args.prompt_len), generator=g).tolist()
        run_pagoda(llm, prompts[:1], 4)  # warm-up
        timer.decode_times.clear()
        t_pagoda = statistics.median(
            run_pagoda(llm, prompts, args.output_len) for _ in range(args.repeats)
        )
        steps = [s for s in timer.decode_times if s[0] == b]
        step = statistics.median(s[2] for s in steps)
        kv_tokens = statistics.median(s[1] for s in steps)
        read = weight_bytes - embed_bytes + (b * row_bytes if embed_bytes else 0)
        roofline = (read + kv_tokens * kv_bytes_per_token) / bw
        row = {
            "batch": b,
            "pagoda_tok_s": b * args.output_len / t_pagoda,
            "decode_step_ms": step * 1e3,
            "roofline_step_ms": roofline * 1e3,
            "fraction_of_roofline": roofline / step,
        }
        if hf is not None:
            run_hf(hf, prompts[:1], 4)
            t_hf = statistics.median(
                run_hf(hf, prompts, args.output_len) for _ in range(args.repeats)
            )
            row["hf_tok_s"] = b * args.output_len / t_hf
            row["speedup_vs_hf"] = row["pagoda_tok_s"] / row["hf_tok_s"]
        results["rows"].append(row)
        print(row, flush=True)

    if args.eager_batches:
        # The engine's budget is a fraction of the whole device with this
        # process's other tensors counted in: free the first engine and the
        # transformers model (its rows are done) before building another.
        del llm, timer, runner, hf
        gc.collect()  # the engine's cycles hold the KV cache until collected
        torch.cuda.empty_cache()
        eager = LLM(**common, enforce_eager=True)
        etimer = StepTimer(eager.engine.engine_core.executor.worker.runner)
        for b in args.eager_batches:
            prompts = torch.randint(256, vocab, (b, args.prompt_len), generator=g).tolist()
            run_pagoda(eager, prompts[:1], 4)
            etimer.decode_times.clear()
            run_pagoda(eager, prompts, args.output_len)
            step = statistics.median(s[2] for s in etimer.decode_times if s[0] == b)
            graph_row = next((r for r in results["rows"] if r["batch"] == b), None)
            entry = {"batch": b, "eager_step_ms": step * 1e3}
            if graph_row:
                entry["graph_step_ms"] = graph_row["decode_step_ms"]
                entry["graph_saving"] = 1 - graph_row["decode_step_ms"] / (step * 1e3)
            results.setdefault("cuda_graphs", []).append(entry)
            print(entry, flush=True)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\n{results['device']}, {args.dtype}, copy bandwidth {bw / 1e9:.0f} GB/s")
    print(
        f"{'batch':>5} {'pagoda tok/s':>12} {'hf tok/s':>9} {'x hf':>6} {'step ms':>8} {'roofline ms':>11} {'%roof':>6}"
    )
    for r in results["rows"]:
        print(
            f"{r['batch']:5d} {r['pagoda_tok_s']:12.0f} {r.get('hf_tok_s', float('nan')):9.0f} "
            f"{r.get('speedup_vs_hf', float('nan')):6.2f} {r['decode_step_ms']:8.2f} "
            f"{r['roofline_step_ms']:11.2f} {100 * r['fraction_of_roofline']:6.0f}"
        )
    for e in results.get("cuda_graphs", []):
        print(
            f"CUDA graphs at batch {e['batch']}: eager {e['eager_step_ms']:.2f} ms/step, saving {100 * e.get('graph_saving', float('nan')):.0f}%"
        )


if __name__ == "__main__":
    main()
