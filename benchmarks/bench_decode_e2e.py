"""End-to-end decode on a GPU: Pagoda against transformers on a
Llama-3-8B-shaped model with random bf16 (or --dtype float16) weights, and each step against the
memory roofline.

For every batch size B: B requests with prompts of --prompt-len random
token ids each generate exactly --output-len tokens (greedy, EOS ignored).

  pagoda          the engine with CUDA graphs (the default on CUDA), once
                  per --async-modes entry (async scheduling on, then off)
  pagoda-eager    the same engine with --enforce-eager (batch 1 only by
                  default, to show what graphs save)
  hf              transformers `generate` on the same model shape and batch

Reported: output tokens/s (whole request, prefill included; the median of
--repeats runs); the median decode step period (wall time from one
decode-only step's launch to the next's, nothing synchronised: the whole
loop's cost of a step); for the synchronous loop also the step timed inside
the model runner with the device synchronised around it (what earlier runs
called the step time). Each against the roofline: weight bytes (of an
untied embedding table only the step's rows) + KV bytes read in the step
over the measured device copy bandwidth.

    python benchmarks/bench_decode_e2e.py                 # B = 1 16 64 256
    python benchmarks/bench_decode_e2e.py --batch 1 64 --output-len 64 --async-modes on
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
    """Wraps ModelRunner.execute_model and times its decode-only steps.

    period: wall time from one decode step's launch to the next's at the same
    batch, no synchronisation: what a step costs the whole loop (scheduling,
    bookkeeping, sampling and the device's work). With async scheduling the
    host's share hides behind the device's, and this is the only fair clock.
    bracketed (sync loop only): the time inside the call with the device
    synchronised on both sides, the runner's own share (the previous
    sessions' "step ms"; the synchronisation would defeat async scheduling).
    """

    def __init__(self, runner, bracket: bool):
        self.runner = runner
        self.inner = runner.execute_model
        self.bracket = bracket
        self.periods: list[tuple[int, int, float]] = []  # (batch, kv tokens, seconds)
        self.bracketed: list[tuple[int, float]] = []
        self._last: tuple[int, float] | None = None
        runner.execute_model = self

    def clear(self) -> None:
        self.periods.clear()
        self.bracketed.clear()
        self._last = None

    def __call__(self, so):
        now = time.perf_counter()
        batch = len(so.num_scheduled_tokens)
        decode = so.total_num_scheduled_tokens == batch > 0
        if decode and self._last is not None and self._last[0] == batch:
            # Each request reads its context and writes one token.
            kv = sum(so.scheduled_cached_reqs.num_computed_tokens) + batch
            self.periods.append((batch, kv, now - self._last[1]))
        self._last = (batch, now) if decode else None
        if not (self.bracket and decode):
            return self.inner(so)
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = self.inner(so)
        torch.cuda.synchronize()
        self.bracketed.append((batch, time.perf_counter() - t))
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
        "--async-modes",
        nargs="+",
        default=["on", "off"],
        choices=["on", "off"],
        help="engines to measure, one after the other (async scheduling on / off)",
    )
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

    llm = LLM(**common, async_scheduling=args.async_modes[0])
    runner = llm.engine.engine_core.executor.worker.runner
    weight_bytes = runner.weight_bytes
    # A step reads only its B rows of an untied embedding table, not all of
    # it (1 GB of Llama-3-8B's 16): the roofline counts what must be read.
    embed = runner.model.model.embed_tokens.weight
    tied = runner.model.lm_head.weight.data_ptr() == embed.data_ptr()
    embed_bytes = 0 if tied else embed.numel() * embed.element_size()
    row_bytes = embed.shape[1] * embed.element_size()
    kv_bytes_per_token = runner.kv_bytes_per_block() // runner.cache_config.block_size
    del runner

    def roofline_s(b: int, kv_tokens: float) -> float:
        read = weight_bytes - embed_bytes + (b * row_bytes if embed_bytes else 0)
        return (read + kv_tokens * kv_bytes_per_token) / bw

    prompts_of = {
        b: torch.randint(256, vocab, (b, args.prompt_len), generator=g).tolist() for b in args.batch
    }
    for i, mode in enumerate(args.async_modes):
        if i:
            del llm
            gc.collect()  # the engine's cycles hold the KV cache until collected
            torch.cuda.empty_cache()
            llm = LLM(**common, async_scheduling=mode)
        core = llm.engine.engine_core
        timer = StepTimer(core.executor.worker.runner, bracket=not core.async_scheduling)
        for b in args.batch:
            prompts = prompts_of[b]
            run_pagoda(llm, prompts[:1], 4)  # warm-up
            timer.clear()
            t_pagoda = statistics.median(
                run_pagoda(llm, prompts, args.output_len) for _ in range(args.repeats)
            )
            periods = [p for p in timer.periods if p[0] == b]
            period = statistics.median(p[2] for p in periods)
            roofline = roofline_s(b, statistics.median(p[1] for p in periods))
            row = {
                "async_scheduling": mode,
                "batch": b,
                "pagoda_tok_s": b * args.output_len / t_pagoda,
                "step_period_ms": period * 1e3,
                "roofline_step_ms": roofline * 1e3,
                "fraction_of_roofline": roofline / period,
            }
            bracketed = [t for n, t in timer.bracketed if n == b]
            if bracketed:
                row["bracketed_step_ms"] = statistics.median(bracketed) * 1e3
                row["bracketed_fraction_of_roofline"] = roofline / statistics.median(bracketed)
            results["rows"].append(row)
            print(row, flush=True)
        del timer, core

    hf = None
    if not args.no_hf:
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        llm = None
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(**{k: v for k, v in PRESETS[args.preset].items() if k != "architectures"})
        # Built in the half dtype directly: a float32 build of 8B weights
        # (32 GB) would not fit beside the engine on an 80 GB card.
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, args.dtype))
        try:
            with torch.device("cuda"):
                hf = LlamaForCausalLM(cfg).eval()
        finally:
            torch.set_default_dtype(default_dtype)
        for b in args.batch:
            run_hf(hf, prompts_of[b][:1], 4)
            t_hf = statistics.median(
                run_hf(hf, prompts_of[b], args.output_len) for _ in range(args.repeats)
            )
            for row in results["rows"]:
                if row["batch"] == b:
                    row["hf_tok_s"] = b * args.output_len / t_hf
                    row["speedup_vs_hf"] = row["pagoda_tok_s"] / row["hf_tok_s"]

    if args.eager_batches:
        del llm, hf
        gc.collect()
        torch.cuda.empty_cache()
        eager = LLM(**common, enforce_eager=True, async_scheduling="off")
        etimer = StepTimer(eager.engine.engine_core.executor.worker.runner, bracket=True)
        for b in args.eager_batches:
            prompts = torch.randint(256, vocab, (b, args.prompt_len), generator=g).tolist()
            run_pagoda(eager, prompts[:1], 4)
            etimer.clear()
            run_pagoda(eager, prompts, args.output_len)
            step = statistics.median(t for n, t in etimer.bracketed if n == b)
            graph_row = next(
                (r for r in results["rows"] if r["batch"] == b and "bracketed_step_ms" in r), None
            )
            entry = {"batch": b, "eager_step_ms": step * 1e3}
            if graph_row:
                entry["graph_step_ms"] = graph_row["bracketed_step_ms"]
                entry["graph_saving"] = 1 - graph_row["bracketed_step_ms"] / (step * 1e3)
            results.setdefault("cuda_graphs", []).append(entry)
            print(entry, flush=True)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\n{results['device']}, {args.dtype}, copy bandwidth {bw / 1e9:.0f} GB/s")
    print(
        f"{'async':>5} {'batch':>5} {'pagoda tok/s':>12} {'hf tok/s':>9} {'x hf':>6} "
        f"{'period ms':>9} {'in-call ms':>10} {'roofline ms':>11} {'%roof':>6}"
    )
    nan = float("nan")
    for r in results["rows"]:
        print(
            f"{r['async_scheduling']:>5} {r['batch']:5d} {r['pagoda_tok_s']:12.0f} "
            f"{r.get('hf_tok_s', nan):9.0f} {r.get('speedup_vs_hf', nan):6.2f} "
            f"{r['step_period_ms']:9.2f} {r.get('bracketed_step_ms', nan):10.2f} "
            f"{r['roofline_step_ms']:11.2f} {100 * r['fraction_of_roofline']:6.0f}"
        )
    for e in results.get("cuda_graphs", []):
        print(
            f"CUDA graphs at batch {e['batch']}: eager {e['eager_step_ms']:.2f} ms/step, saving {100 * e.get('graph_saving', float('nan')):.0f}%"
        )


if __name__ == "__main__":
    main()
