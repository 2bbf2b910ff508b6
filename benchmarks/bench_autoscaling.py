"""Simulate the built-in autoscaler against fixed-for-peak and a KEDA-style rule; plot it.

A fourth policy is the built-in scaler on pods without the arrival counters
(gauges only): the rule before the arrival signal. Service times come from a
`pagoda bench serve` result (TTFT and TPOT at the pod's batch size), or are
given (`--ttft 2.064 --tpot 0.152 --slots 4 --output-len 64` are that run's
means); pod start time is a parameter:

    pagoda serve smollm2-135m-instruct --port 8765 ...   # maxNumSeqs 4
    pagoda bench serve --base-url http://127.0.0.1:8765 --num-prompts 24 \\
        --input-len 128 --output-len 64 --max-concurrency 4 \\
        --result-file .bench/autoscaling_serve.json
    .venv/bin/python benchmarks/bench_autoscaling.py \\
        --bench .bench/autoscaling_serve.json --plot docs/autoscaling.png \\
        --out .bench/autoscaling.json

See docs/autoscaling.md for the model and the results.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from autoscaling_sim import (
    Service,
    Trace,
    Workload,
    builtin,
    default_policy,
    fixed,
    simulate,
    threshold_rule,
)

POLICIES = ("builtin", "fixed-for-peak", "threshold (KEDA-style)", "builtin, gauges only")


def peak_replicas(workload: Workload, service: Service, utilization: float) -> int:
    """Replicas that serve the burst rate at `utilization` of their batch capacity."""
    return math.ceil(workload.burst / (service.capacity() * utilization))


def run_all(
    workload: Workload,
    service: Service,
    target: float,
    max_replicas: int,
    utilization: float,
    running: float | None = None,
) -> dict[str, Trace]:
    """The three policies over the same arrivals (the same queue target for both scalers)."""
    peak = peak_replicas(workload, service, utilization)
    start = max(1, math.ceil(workload.base / (service.capacity() * utilization)))
    extra = {"targetRunningRequests": running} if running else {}
    policy = default_policy(max_replicas, service.slots, targetQueueDepth=target, **extra)
    return {
        "builtin": simulate(workload, service, builtin(policy), start),
        "fixed-for-peak": simulate(workload, service, fixed(peak), peak),
        "threshold (KEDA-style)": simulate(
            workload, service, threshold_rule(target, 1, max_replicas), start
        ),
        # The same scaler on a runtime without the arrival counters (the rule before them).
        "builtin, gauges only": simulate(workload, service, builtin(policy, counters=False), start),
    }


def plot(traces: dict[str, Trace], workload: Workload, path: Path, title: str) -> None:
    """Replicas and queue depth over time, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for name, trace in traces.items():
        minutes = [t / 60 for t in trace.times]
        style = {"linestyle": ":", "alpha": 0.8} if name == "builtin, gauges only" else {}
        top.step(minutes, trace.replicas, where="post", label=name, **style)
        bottom.plot(minutes, trace.queue, label=name, linewidth=1, **style)
    for axis in (top, bottom):
        axis.axvspan(workload.burst_start / 60, workload.burst_end / 60, color="0.9", zorder=0)
        axis.grid(alpha=0.3)
    top.set_ylabel("replicas")
    top.legend(loc="upper right")
    top.set_title(title)
    bottom.set_ylabel("requests waiting (all pods)")
    bottom.set_xlabel("minutes (shaded: the burst)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, help="a `pagoda bench serve` --result-file")
    parser.add_argument("--ttft", type=float, help="seconds (else the bench's mean)")
    parser.add_argument("--tpot", type=float, help="seconds (else the bench's mean)")
    parser.add_argument("--slots", type=int, help="batch size (else the bench's concurrency)")
    parser.add_argument("--output-len", type=int, help="(else the bench's)")
    parser.add_argument("--pod-start", type=float, default=34.0, help="seconds to ready")
    parser.add_argument("--sweep-pod-start", default="10,34,60,120")
    parser.add_argument("--base-fraction", type=float, default=0.25, help="base / burst rate")
    parser.add_argument("--burst-pods", type=float, default=6.0, help="burst in pods' capacity")
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--burst-start", type=float, default=900.0)
    parser.add_argument("--burst-seconds", type=float, default=600.0)
    parser.add_argument("--target-queue-depth", type=float, default=1.0)
    parser.add_argument(
        "--target-running-requests",
        type=float,
        default=3.0,
        help="the built-in scaler's secondary signal (0: off); 3 of 4 slots",
    )
    parser.add_argument("--max-replicas", type=int, default=16)
    parser.add_argument("--utilization", type=float, default=0.8, help="fixed-for-peak sizing")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    bench = json.loads(args.bench.read_text()) if args.bench else {}
    service = Service(
        slots=args.slots or int(bench["max_concurrency"]),
        ttft=args.ttft or float(bench["ttft_s"]["mean"]),
        tpot=args.tpot or float(bench["tpot_s"]["mean"]),
        output_len=args.output_len or int(bench["config"]["output_len"]),
        pod_start=args.pod_start,
    )
    burst = args.burst_pods * service.capacity()

    def workload(seed: int) -> Workload:
        return Workload(
            base=burst * args.base_fraction,
            burst=burst,
            burst_start=args.burst_start,
            burst_end=args.burst_start + args.burst_seconds,
            duration=args.duration,
            seed=seed,
        )

    print(
        f"service: {service.slots} slots, TTFT {service.ttft * 1e3:.0f} ms, TPOT "
        f"{service.tpot * 1e3:.0f} ms, {service.output_len} tokens -> "
        f"{service.service_time:.2f} s per request, {service.capacity():.3f} req/s per pod"
    )
    print(f"workload: {burst * args.base_fraction:.3f} req/s, burst {burst:.3f} req/s")
    results: dict[str, object] = {
        "service": {
            "slots": service.slots,
            "ttft_s": service.ttft,
            "tpot_s": service.tpot,
            "output_len": service.output_len,
            "service_time_s": service.service_time,
        },
        "workload": {"base_rps": burst * args.base_fraction, "burst_rps": burst},
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    sweep = {}
    header = f"{'pod start':>9}  {'policy':<24}{'p50 q (s)':>10}{'p99 q (s)':>10}{'replica-s':>11}"
    print(header)
    for pod_start in [float(x) for x in args.sweep_pod_start.split(",")]:
        per_policy: dict[str, dict[str, float]] = {}
        runs = [
            run_all(
                workload(seed),
                replace(service, pod_start=pod_start),
                args.target_queue_depth,
                args.max_replicas,
                args.utilization,
                args.target_running_requests,
            )
            for seed in [int(s) for s in args.seeds.split(",")]
        ]
        for name in POLICIES:
            rows = [traces[name].summary() for traces in runs]
            mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
            per_policy[name] = mean
            print(
                f"{pod_start:>8.0f}s  {name:<24}{mean['queue_p50_s']:>10.2f}"
                f"{mean['queue_p99_s']:>10.2f}{mean['replica_seconds']:>11.0f}"
            )
        ours, peak, rule = (per_policy[n] for n in POLICIES[:3])
        verdict = {
            "p99_vs_fixed": ours["queue_p99_s"] / max(peak["queue_p99_s"], 1e-9),
            "replica_seconds_vs_fixed": ours["replica_seconds"] / peak["replica_seconds"],
            "beats_threshold_p99": ours["queue_p99_s"] < rule["queue_p99_s"],
            "beats_threshold_cost": ours["replica_seconds"] < rule["replica_seconds"],
        }
        print(f"{'':>11}{json.dumps(verdict)}")
        sweep[str(pod_start)] = {"policies": per_policy, "verdict": verdict}
    results["sweep"] = sweep
    if args.plot:
        svc = replace(service, pod_start=args.pod_start)
        traces = run_all(
            workload(0),
            svc,
            args.target_queue_depth,
            args.max_replicas,
            args.utilization,
            args.target_running_requests,
        )
        plot(
            traces,
            workload(0),
            args.plot,
            f"Poisson load with a burst; pod start {args.pod_start:.0f} s; "
            f"{service.service_time:.1f} s per request, {service.slots} per pod",
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
