"""Where a GPU decode step's time goes, for the step-vs-roofline gap of
benchmarks/bench_decode_e2e.py: the engine's decode steps on a
Llama-3-8B shape under torch.profiler, wall time per step against the GPU's
kernel time (the difference is time the GPU waits for the host), and the
kernels and host calls that take the most time. The linears alone, against
a Triton kernel: benchmarks/gpu/bench_skinny_gemm.py.

    python benchmarks/gpu/profile_decode_step.py --batch 1 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def profile_steps(llm, batch: int, vocab: int, output_len: int) -> None:
    from pagoda.runtime import SamplingParams
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(256, vocab, (batch, 128), generator=g).tolist()
    params = SamplingParams(
        temperature=0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True
    )
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    runner = llm.engine.engine_core.executor.worker.runner
    inner = runner.execute_model
    walls: list[float] = []

    def timed(so):
        decode = so.total_num_scheduled_tokens == len(so.num_scheduled_tokens) == batch
        t = time.perf_counter()
        out = inner(so)
        if decode:
            walls.append(time.perf_counter() - t)
        return out

    runner.execute_model = timed
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts, params)
    runner.execute_model = inner
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    steps = len(walls)
    print(
        f"batch {batch}: {steps} decode steps, wall median {statistics.median(walls) * 1e3:.2f} ms"
        f" (profiler on); GPU kernel time over the whole generate {gpu_us / 1e3:.1f} ms"
    )
    table = prof.key_averages().table(
        sort_by="self_device_time_total", row_limit=18, max_name_column_width=60
    )
    print(table)
    cpu = prof.key_averages().table(
        sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60
    )
    print(cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--output-len", type=int, default=16)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_decode_step needs a CUDA device")

    from pagoda.runtime import LLM
    from pagoda.runtime.model_loader.random_loader import PRESETS

    llm = LLM(
        model="llama-3-8b",
        random_weights=True,
        dtype="bfloat16",
        max_model_len=512,
        max_num_seqs=max(args.batch),
        gpu_memory_utilization=0.45,
    )
    for b in args.batch:
        profile_steps(llm, b, PRESETS["llama-3-8b"]["vocab_size"], args.output_len)
    return 0


if __name__ == "__main__":
    sys.exit(main())
