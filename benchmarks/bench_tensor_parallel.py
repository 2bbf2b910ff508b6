"""Tensor parallelism's costs on the CPU.

1. The step broadcast: the pickled size of a steady decode step's message
   (SchedulerOutput + the tokens rank 0 sampled last step) for 64, 256 and
   1,024 running requests at prompt lengths 128, 1,024 and 4,096, and the time
   from `send` until every one of two reader processes has it unpickled.
2. A decode step of a random-weight model at TP=1 and TP=2 (gloo), batch 8:
   what the all-reduces (two per layer) and the broadcast add per step.

    .venv/bin/python benchmarks/bench_tensor_parallel.py [--out .bench/tensor_parallel.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pickle
import statistics
import time
from pathlib import Path

from pagoda.runtime.config import CacheConfig, SchedulerConfig
from pagoda.runtime.core.request import Request
from pagoda.runtime.core.sched_output import ModelRunnerOutput
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.distributed.shm_broadcast import BroadcastReader, BroadcastWriter
from pagoda.runtime.sampling_params import SamplingParams


def decode_step_message(num_reqs: int, prompt_len: int) -> tuple:
    """The broadcast message of a steady decode step (every request running)."""
    max_len = prompt_len + 256
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=num_reqs, max_num_batched_tokens=num_reqs * max_len, max_model_len=max_len
        ),
        CacheConfig(block_size=16),
        num_blocks=num_reqs * (max_len // 16),
    )
    for i in range(num_reqs):
        prompt = [i % 50_000, *range(prompt_len - 1)]
        sched.add_request(Request(f"req-{i}", prompt, SamplingParams(max_tokens=200), max_len))
    sampled: dict[str, list[int]] = {}
    for _ in range(4):
        out = sched.schedule()
        sampled = {r: [1234] for r in out.num_scheduled_tokens}
        sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))
    return ("step", sched.schedule(), sampled)


def _reader(handle, index, acks, count):
    reader = BroadcastReader(handle, index)
    for _ in range(count):
        reader.recv(timeout=60)
        acks.send(1)
    reader.close()


def broadcast_latency_us(message: tuple, repeats: int) -> float:
    """Median µs from send() until both readers have the message unpickled."""
    ctx = multiprocessing.get_context("fork")
    writer = BroadcastWriter(num_readers=2)
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [
        ctx.Process(target=_reader, args=(writer.handle, i, pipes[i][1], repeats)) for i in range(2)
    ]
    for p in procs:
        p.start()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        writer.send(message, timeout=60)
        for recv_end, _ in pipes:
            recv_end.recv()
        times.append((time.perf_counter() - start) * 1e6)
    for p in procs:
        p.join(30)
    writer.close()
    return statistics.median(times[3:])


def decode_step_ms(tp: int, layers: int, steps: int, threads: int) -> float:
    """Median ms of an engine step when 8 requests are all decoding.

    TP=1 runs in this process on `threads` torch threads; each TP=2 worker
    gets its share of the cores (one each on two cores)."""
    import torch
    from pagoda.runtime.entrypoints.llm import LLM

    torch.set_num_threads(threads)
    llm = LLM(
        "llama-3-8b",
        random_weights=True,
        dtype="float32",
        tensor_parallel_size=tp,
        max_model_len=512,
        num_kv_blocks=512,
        hf_overrides={
            "num_hidden_layers": layers,
            "hidden_size": 1024,
            "intermediate_size": 3584,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "vocab_size": 32000,
        },
    )
    try:
        engine = llm.engine
        params = SamplingParams(temperature=0, max_tokens=steps + 20, ignore_eos=True)
        for i in range(8):
            engine.add_request(f"r{i}", list(range(10 + i, 74 + i)), params)
        for _ in range(3):  # prefill, then settle into decode
            engine.step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    finally:
        llm.engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    print(
        f"{'running':>8s} {'prompt':>7s} {'bytes':>9s} {'bytes/req':>9s} {'µs to 2 readers':>16s}"
    )
    for num_reqs in (64, 256, 1024):
        for prompt_len in (128, 1024, 4096):
            message = decode_step_message(num_reqs, prompt_len)
            size = len(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
            latency = broadcast_latency_us(message, args.repeats)
            rows.append(
                {"running": num_reqs, "prompt_len": prompt_len, "bytes": size, "us": latency}
            )
            print(f"{num_reqs:8d} {prompt_len:7d} {size:9d} {size / num_reqs:9.1f} {latency:16.1f}")
    steps: dict[str, list[float]] = {}
    configs = [("TP=1, 1 thread", 1, 1), ("TP=1, 2 threads", 1, 2), ("TP=2, 1 thread each", 2, 1)]
    for _ in range(3):  # alternating rounds, medians
        for name, tp, threads in configs:
            steps.setdefault(name, []).append(decode_step_ms(tp, args.layers, args.steps, threads))
    print(f"decode step, batch 8, {args.layers} layers of hidden 1024, float32:")
    for name, values in steps.items():
        print(f"  {name:22s} median {statistics.median(values):7.1f} ms  (rounds {values})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"broadcast": rows, "decode_step_ms": steps}, indent=2))


if __name__ == "__main__":
    main()
