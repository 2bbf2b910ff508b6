"""One prefill step of a request whose prefix is cached, against the same
number of tokens uncached (the shared-prefix case, offline).

The offline engine caches a `--prefix-len` prompt prefix once; then, in
alternating rounds, it runs one request of that prefix plus `--suffix-len`
new tokens, and one request of `prefix + suffix` new tokens, each with
`max_tokens` 1, timed from `add_request` until it finishes. The ratio of the
medians is the best a server's TTFT with caching on / off can reach on this
machine, without queueing: the server's waves (requests of a closed loop
arriving together) only add to both sides.

    python benchmarks/bench_prefix_step.py --dtype bfloat16

`--sweep N...` also times the cached step for each of those numbers of new
tokens: the line through them splits a step into a part that grows with
the tokens and a part that does not (reading the weights, the eager
forward's host work). One new token is a decode step, replayed from a graph
where one was captured.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch


def timed_request(engine, prompt: list[int], params) -> float:
    """Seconds from adding one request until the engine has finished it."""
    engine.add_request(engine.next_request_id(), prompt, params)
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prefix-len", type=int, default=384)
    ap.add_argument("--suffix-len", type=int, default=80)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sweep", type=int, nargs="*", default=[], help="new-token counts to time")
    ns = ap.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)

    from pagoda.runtime import LLM, SamplingParams

    engine = LLM(dtype=ns.dtype, enable_prefix_caching=True).engine
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(256, 49152) for _ in range(n)]

    prefix = tokens(ns.prefix_len)
    timed_request(engine, prefix + tokens(16), params)  # caches the prefix, warms up
    cached, whole = [], []
    for _ in range(ns.rounds):
        cached.append(timed_request(engine, prefix + tokens(ns.suffix_len), params) * 1e3)
        whole.append(timed_request(engine, tokens(ns.prefix_len + ns.suffix_len), params) * 1e3)
    for n in ns.sweep:
        times = [timed_request(engine, prefix + tokens(n), params) * 1e3 for _ in range(ns.rounds)]
        print(f"cached prefix + {n:4d} new: median {statistics.median(times):6.1f} ms")
    c, w = statistics.median(cached), statistics.median(whole)
    total = ns.prefix_len + ns.suffix_len
    print(f"cached prefix + {ns.suffix_len} new: median {c:.1f} ms {[round(x) for x in cached]}")
    print(f"{total} new:              median {w:.1f} ms {[round(x) for x in whole]}")
    print(
        f"whole / cached {w / c:.2f}; per new token {c / ns.suffix_len:.2f} "
        f"against {w / total:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
