"""Decode attention: achieved memory bandwidth against the device's copy bandwidth.

One command on a CUDA machine:

    python benchmarks/kernels/bench_decode_attention.py

A decode step reads every request's whole K/V context once, so the kernel is
memory-bound and its figure of merit is bytes read / time against what the
device can stream at all, measured here as a device-to-device copy (read +
write bytes / time). Default shape: bf16, head size 128, GQA 8 with 32 query
heads and 4 KV heads (one tensor-parallel rank of Llama-3-70B at TP=2; all
Llama-3 models use GQA with 8 KV heads in total), block size 16, every request
at the same context, block ids shuffled across the pool as a long-running
server leaves them.

Timing: each configuration is captured in CUDA graphs of `--calls-per-graph`
back-to-back calls (so host launch cost, which a graph-replaying decode step
does not pay, does not count, and one replay's fixed cost is shared as a
decode step's graph shares it among its kernels), warmed up, then replayed
`--reps` times between CUDA events; the median over calls is reported. The
calls cycle over several independent input sets whose total size is at least
4x the L2 cache, so no call finds its K/V in L2 from the previous one.

Writes a table to stdout and JSON (`--out`, default
benchmarks/results/decode_attention_<device>.json).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

BATCHES = [1, 4, 16, 32, 64, 128, 256]
CONTEXTS = [512, 1024, 2048, 4096, 8192, 16384, 32768]


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        sys.exit(
            "bench_decode_attention: no CUDA device found; this benchmark times the Triton "
            "decode kernel on a GPU. (On the CPU, run `pytest tests/kernels` for correctness.)"
        )


def measure_copy_bandwidth(nbytes: int = 2 << 30, reps: int = 30) -> float:
    """Device copy bandwidth in bytes/s: (read + write) bytes over the median
    time of a `dst.copy_(src)` of `nbytes`, far larger than L2."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(5):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * nbytes / statistics.median(times)


def _make_set(batch, context, num_heads, num_kv_heads, head_size, block_size, dtype, gen):
    """One independent decode step: query, paged cache, shuffled block table."""
    blocks_per_req = math.ceil(context / block_size)
    num_blocks = batch * blocks_per_req
    cache = torch.empty(
        (2, num_blocks, block_size, num_kv_heads, head_size), dtype=dtype, device="cuda"
    )
    cache.normal_(generator=gen)
    perm = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32)
    block_table = perm.view(batch, blocks_per_req)
    query = torch.randn((batch, num_heads, head_size), dtype=dtype, device="cuda", generator=gen)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    out = torch.empty_like(query)
    return query, cache, block_table, seq_lens, qsl, out


def _time_graphs(graphs: list, warmup: int, reps: int) -> float:
    """Median seconds of one replay, cycling over `graphs` (independent input sets)."""
    for i in range(warmup):
        graphs[i % len(graphs)].replay()
    times = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graphs[i % len(graphs)].replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _capture(fn, sets: list, calls: int) -> list:
    """CUDA graphs of `calls` back-to-back calls of `fn`, each on the next
    input set (fn already ran once per set): one graph per starting set.

    Several calls per graph put the kernel among neighbours, as in a decode
    step's graph, so the fixed cost of one replay and its events (several
    microseconds, a third of a 30 us kernel) is spread over `calls`."""
    torch.cuda.synchronize()
    graphs = []
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(len(sets)):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                for j in range(calls):
                    fn(sets[(i + j) % len(sets)])
            graphs.append(g)
    torch.cuda.synchronize()
    return graphs


def bench_config(
    args,
    batch: int,
    context: int,
    l2_bytes: int,
    num_splits: int | None,
    launch: dict | None = None,
    sdpa: bool = False,
) -> dict:
    """Time the Triton decode kernel at one shape (and launch override, if
    any); with `sdpa`, also torch SDPA over the same K/V gathered dense."""
    from pagoda.kernels.paged_attention import paged_attention_triton

    dtype = getattr(torch, args.dtype)
    elem = torch.finfo(dtype).bits // 8
    kv_bytes = 2 * batch * context * args.num_kv_heads * args.head_size * elem
    q_out_bytes = 2 * batch * args.num_heads * args.head_size * elem
    set_bytes = kv_bytes + q_out_bytes
    num_sets = max(1, min(args.max_sets, math.ceil(4 * l2_bytes / set_bytes)))
    gen = torch.Generator(device="cuda").manual_seed(batch * 100003 + context)
    sets = [
        _make_set(
            batch,
            context,
            args.num_heads,
            args.num_kv_heads,
            args.head_size,
            args.block_size,
            dtype,
            gen,
        )
        for _ in range(num_sets)
    ]
    scale = args.head_size**-0.5

    def step(s):
        query, cache, block_table, seq_lens, qsl, out = s
        paged_attention_triton(
            query,
            cache,
            block_table,
            seq_lens,
            qsl,
            scale,
            max_query_len=1,
            max_seq_len=context,
            out=out,
            num_splits=num_splits,
            **(launch or {}),
        )

    for s in sets:  # compile and warm up outside the graph
        step(s)
    t = _time_graphs(_capture(step, sets, args.calls_per_graph), args.warmup, args.reps)
    t /= args.calls_per_graph

    from pagoda.kernels.paged_attention import choose_num_splits

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    row = {
        "batch": batch,
        "context": context,
        "num_splits": num_splits or choose_num_splits(batch, args.num_kv_heads, context, sms),
        "launch": launch or {},
        "num_sets": num_sets,
        "time_us": t * 1e6,
        "bytes": set_bytes,
        "bandwidth_gbs": set_bytes / t / 1e9,
    }
    if sdpa:
        row.update(_bench_sdpa(args, sets, context))
    del sets
    torch.cuda.empty_cache()
    return row


def _bench_sdpa(args, sets: list, context: int) -> dict:
    """torch SDPA on the same decode step, K/V first gathered dense from the
    paged cache through the block table. The gather is timed with it (a
    dense-cache engine would not pay it), and SDPA alone too: the comparison
    with the gather is generous to Pagoda, the one without it to SDPA."""
    import torch.nn.functional as F

    group = args.num_heads // args.num_kv_heads

    def gather(s):
        query, cache, block_table, *_ = s
        b = query.shape[0]
        kv = cache[:, block_table]  # [2, B, blocks, block_size, kv_heads, D]
        kv = kv.reshape(2, b, -1, args.num_kv_heads, args.head_size)[:, :, :context]
        return kv[0].transpose(1, 2), kv[1].transpose(1, 2)

    def attend(s, k, v):
        q = s[0].unsqueeze(2)  # [B, H, 1, D]
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=group > 1)

    def both(s):
        k, v = gather(s)
        attend(s, k, v)

    dense = [gather(s) for s in sets]
    for s, (k, v) in zip(sets, dense):
        both(s)
        attend(s, k, v)
    calls = args.calls_per_graph
    t_both = _time_graphs(_capture(both, sets, calls), args.warmup, args.reps) / calls
    pairs = list(zip(sets, dense))
    t_attend = (
        _time_graphs(_capture(lambda p: attend(p[0], *p[1]), pairs, calls), args.warmup, args.reps)
        / calls
    )
    del dense, pairs
    return {"sdpa_gather_us": t_both * 1e6, "sdpa_only_us": t_attend * 1e6}


def check_correctness(args) -> float:
    """One small decode batch against the torch twin, natively on the GPU."""
    from pagoda.kernels.paged_attention import paged_attention_triton
    from pagoda.kernels.reference import paged_attention_ref

    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    query, cache, block_table, _, qsl, out = _make_set(
        4, 3000, args.num_heads, args.num_kv_heads, args.head_size, args.block_size, dtype, gen
    )
    seq_lens = torch.tensor([3000, 1, 777, 2049], dtype=torch.int32, device="cuda")
    scale = args.head_size**-0.5
    worst = 0.0
    for splits in (1, 4, None):
        paged_attention_triton(
            query,
            cache,
            block_table,
            seq_lens,
            qsl,
            scale,
            max_query_len=1,
            max_seq_len=3000,
            out=out,
            num_splits=splits,
        )
        ref = paged_attention_ref(query, cache, block_table, seq_lens, qsl, scale)
        err = (
            torch.linalg.vector_norm((out - ref).double()) / torch.linalg.vector_norm(ref.double())
        ).item()
        worst = max(worst, err)
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    parser.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS)
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=4)
    parser.add_argument("--head-size", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument(
        "--splits",
        default="auto",
        help="split-KV factor: 'auto' (the runtime's heuristic) or comma-separated ints to sweep",
    )
    parser.add_argument(
        "--launch",
        nargs="*",
        default=[],
        metavar="TILExWARPSxSTAGES",
        help="launch configs to sweep, e.g. 64x4x3 128x8x2 (default: the runtime's heuristic)",
    )
    parser.add_argument(
        "--sdpa",
        action="store_true",
        help="also time torch SDPA over the same K/V gathered dense (skipped where it does not fit)",
    )
    parser.add_argument(
        "--calls-per-graph",
        type=int,
        default=8,
        help="kernel calls per captured graph, cycling over input sets (1: one call per replay)",
    )
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--max-sets", type=int, default=16)
    parser.add_argument(
        "--max-gib",
        type=float,
        default=None,
        help="skip configs whose input sets exceed this (default: half the free memory)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    _require_cuda()

    props = torch.cuda.get_device_properties(0)
    device_name = props.name
    l2_bytes = getattr(props, "L2_cache_size", 50 << 20)
    free, _ = torch.cuda.mem_get_info()
    max_bytes = int(args.max_gib * (1 << 30)) if args.max_gib else free // 2
    splits_options = [None] if args.splits == "auto" else [int(x) for x in args.splits.split(",")]

    err = check_correctness(args)
    print(f"device: {device_name}, {props.multi_processor_count} SMs, L2 {l2_bytes >> 20} MiB")
    print(f"correctness vs torch twin: rel error {err:.2e}")
    if err > 2e-2:
        print("error too large; not timing a wrong kernel", file=sys.stderr)
        return 1
    copy_bw = measure_copy_bandwidth()
    print(f"device copy bandwidth: {copy_bw / 1e9:.0f} GB/s (read + write)")
    print(
        f"shape: {args.num_heads} q heads / {args.num_kv_heads} kv heads, head {args.head_size}, "
        f"block {args.block_size}, {args.dtype}"
    )
    launches: list[dict | None] = [None] + [
        dict(zip(("tile_n", "num_warps", "num_stages"), map(int, c.split("x"))))
        for c in args.launch
    ]
    header = (
        f"{'batch':>6} {'context':>8} {'splits':>6} {'launch':>9} {'time us':>10} "
        f"{'MB read':>9} {'GB/s':>8} {'% copy':>7}"
        + (f" {'sdpa+gather':>11} {'sdpa':>8}" if args.sdpa else "")
    )
    print(header)
    print("-" * len(header))

    elem = torch.finfo(getattr(torch, args.dtype)).bits // 8
    rows = []
    for batch in args.batches:
        for context in args.contexts:
            kv_bytes = 2 * batch * context * args.num_kv_heads * args.head_size * elem
            if kv_bytes > max_bytes:
                print(f"{batch:>6} {context:>8}  skipped: {kv_bytes / 2**30:.1f} GiB > budget")
                continue
            # Dense K/V for SDPA doubles the footprint.
            sdpa = args.sdpa and 2 * kv_bytes <= max_bytes
            for splits in splits_options:
                for launch in launches:
                    name = "x".join(map(str, launch.values())) if launch else "auto"
                    try:
                        r = bench_config(
                            args, batch, context, l2_bytes, splits, launch, sdpa and launch is None
                        )
                    except Exception as exc:  # e.g. OutOfResources: too much shared memory
                        print(
                            f"{batch:>6} {context:>8} {splits or 'auto':>6} {name:>9}  failed: "
                            f"{type(exc).__name__}: {str(exc)[:80]}"
                        )
                        torch.cuda.empty_cache()
                        continue
                    r["pct_of_copy"] = 100 * r["bandwidth_gbs"] * 1e9 / copy_bw
                    rows.append(r)
                    extra = (
                        f" {r['sdpa_gather_us']:>11.1f} {r['sdpa_only_us']:>8.1f}"
                        if "sdpa_only_us" in r
                        else ""
                    )
                    print(
                        f"{batch:>6} {context:>8} {r['num_splits']:>6} {name:>9} {r['time_us']:>10.1f} "
                        f"{r['bytes'] / 1e6:>9.1f} {r['bandwidth_gbs']:>8.0f} {r['pct_of_copy']:>6.1f}%"
                        + extra,
                        flush=True,
                    )

    # The goal: >= 85% of the copy bandwidth at batch >= 16 and context >= 2k.
    target = [r for r in rows if r["batch"] >= 16 and r["context"] >= 2048 and not r["launch"]]
    if target:
        worst = min(r["pct_of_copy"] for r in target)
        print(
            f"target (batch >= 16, context >= 2k, >= 85% of copy): worst {worst:.1f}% -> "
            f"{'PASS' if worst >= 85 else 'FAIL'}"
        )
    result = {
        "device": device_name,
        "sms": props.multi_processor_count,
        "copy_bandwidth_gbs": copy_bw / 1e9,
        "correctness_rel_error": err,
        "shape": {
            "num_heads": args.num_heads,
            "num_kv_heads": args.num_kv_heads,
            "head_size": args.head_size,
            "block_size": args.block_size,
            "dtype": args.dtype,
        },
        "torch": torch.__version__,
        "rows": rows,
    }
    out = (
        args.out
        or Path("benchmarks/results") / f"decode_attention_{device_name.replace(' ', '_')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
