"""`pagoda bench serve`: load a running OpenAI-compatible server and measure it,
in the spirit of `vllm bench serve`.

Any server that speaks OpenAI's `/v1/completions` with token-id prompts and
`ignore_eos` can be measured (`--base-url`): Pagoda, vLLM, llama.cpp's
llama-server; the same client then measures every system.

Datasets are seeded and made of token ids (the completions API takes them),
so prompt lengths are exact without a tokenizer on the client: `random`
(independent prompts of `--input-len` tokens, or of a length drawn uniformly
from [--input-len, --input-len-max]) and `shared-prefix` (groups of prompts
that share a long prefix, each with its own suffix, for prefix caching).
Every request streams with `ignore_eos`, so each produces exactly
--output-len tokens. Requests go out at a fixed concurrency, or as a Poisson
process at --request-rate (optionally capped by --max-concurrency). Reports
request and token throughput and the TTFT / TPOT / ITL / E2E percentiles, as
a table and as JSON; where the server exposes vLLM's request histograms on
/metrics, also its own mean queue, prefill and decode time per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_len: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""


def _length(rng: random.Random, length: int, length_max: int | None) -> int:
    return length if length_max is None else rng.randint(length, length_max)


def random_dataset(
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    vocab: tuple[int, int],
    input_len_max: int | None = None,
) -> list[BenchRequest]:
    """Independent prompts of random token ids: exactly `input_len` of them,
    or a length drawn uniformly from [input_len, input_len_max]."""
    rng = random.Random(seed)
    lo, hi = vocab
    out = []
    for _ in range(num_prompts):
        n = _length(rng, input_len, input_len_max)
        out.append(BenchRequest([rng.randrange(lo, hi) for _ in range(n)], output_len))
    return out


def shared_prefix_dataset(
    num_prompts: int,
    prefix_len: int,
    suffix_len: int,
    output_len: int,
    num_prefixes: int,
    seed: int,
    vocab: tuple[int, int],
    suffix_len_max: int | None = None,
) -> list[BenchRequest]:
    """`num_prefixes` groups; each prompt is its group's prefix + its own
    suffix (`suffix_len` tokens, or uniform in [suffix_len, suffix_len_max]).
    Prompts are interleaved across groups, as a multi-tenant system prompt mix."""
    rng = random.Random(seed)
    lo, hi = vocab
    prefixes = [[rng.randrange(lo, hi) for _ in range(prefix_len)] for _ in range(num_prefixes)]
    out = []
    for i in range(num_prompts):
        n = _length(rng, suffix_len, suffix_len_max)
        suffix = [rng.randrange(lo, hi) for _ in range(n)]
        out.append(BenchRequest(prefixes[i % num_prefixes] + suffix, output_len))
    return out


async def _one_request(
    session: aiohttp.ClientSession, url: str, model: str, req: BenchRequest, headers: dict
) -> RequestResult:
    body = {
        "model": model,
        "prompt": req.prompt_token_ids,
        "max_tokens": req.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = RequestResult(ok=False, prompt_len=len(req.prompt_token_ids))
    start = time.perf_counter()
    last = start
    # Servers that send no usage chunk (or count differently) are measured
    # by their token chunks: with ignore_eos each carries one token.
    chunks = 0
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                return result
            # The client shares the machine with the server it measures, so
            # its per-token work is kept small: aiohttp's C line reader and
            # one json.loads per event (with httpx's streaming the client
            # took 0.55 ms of CPU per token, with this 0.25).
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                now = time.perf_counter()
                if chunk.get("usage"):
                    result.output_len = chunk["usage"]["completion_tokens"]
                choices = chunk.get("choices")
                if not choices:
                    continue  # the usage chunk
                if not choices[0].get("text") and choices[0].get("finish_reason"):
                    continue  # a closing chunk without a token (llama-server)
                chunks += 1
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
        result.e2e = time.perf_counter() - start
        result.output_len = result.output_len or chunks
        result.ok = result.output_len > 0
        if not result.ok:
            result.error = "no tokens"
    except (aiohttp.ClientError, ValueError) as exc:  # JSON, Unicode, a line too long
        result.error = repr(exc)
    return result


# The server's own split of a request's time, where it exposes vLLM's
# histograms (Pagoda and vLLM do; llama-server does not): TTFT = queue +
# prefill on the server's clock, and the client's TTFT less those two is the
# HTTP and API path. Read as the change of each histogram's sum and count
# over the run, so only this run's requests count (another client's would).
SERVER_HISTOGRAMS = {
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
}


def parse_histogram_totals(text: str) -> dict[str, tuple[float, float]]:
    """{key: (sum, count)} of SERVER_HISTOGRAMS in a Prometheus exposition,
    summed over label sets (several models); {} for one that does not parse."""
    wanted = {
        f"{name}{part}": (key, index)
        for key, name in SERVER_HISTOGRAMS.items()
        for part, index in (("_sum", 0), ("_count", 1))
    }
    totals: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    key, index = wanted[sample.name]
                    totals.setdefault(key, [0.0, 0.0])[index] += sample.value
    except ValueError:  # a malformed line: no split rather than a wrong one
        return {}
    return {key: (v[0], v[1]) for key, v in totals.items()}


async def _server_histograms(
    client: aiohttp.ClientSession, root: str, headers: dict
) -> dict[str, tuple[float, float]]:
    """The server's histogram totals, or {} where it has no /metrics."""
    try:
        async with client.get(f"{root}/metrics", headers=headers) as resp:
            if resp.status != 200:
                return {}
            return parse_histogram_totals(await resp.text())
    except (aiohttp.ClientError, UnicodeDecodeError):
        return {}


def server_split(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Mean seconds per request of each histogram over a run: {"queue_mean": ...}."""
    out = {}
    for key, (total, count) in after.items():
        total0, count0 = before.get(key, (0.0, 0.0))
        if count > count0:
            out[f"{key}_mean"] = (total - total0) / (count - count0)
    return out


def _percentiles(values: list[float], ps: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "median": math.nan, **{f"p{p:g}": math.nan for p in ps}}
    ordered = sorted(values)
    out = {"mean": statistics.fmean(ordered), "median": statistics.median(ordered)}
    for p in ps:
        # Nearest-rank percentile: a value that was actually observed.
        k = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
        out[f"p{p:g}"] = ordered[k]
    return out


def summarize(results: list[RequestResult], duration: float, ps: list[float]) -> dict:
    """Throughputs and latency percentiles (seconds) of one benchmark run."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    tpots = [(r.e2e - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "ttft_s": _percentiles([r.ttft for r in ok], ps),
        "tpot_s": _percentiles(tpots, ps),
        "itl_s": _percentiles([x for r in ok for x in r.itls], ps),
        "e2e_s": _percentiles([r.e2e for r in ok], ps),
    }


async def run_benchmark(
    base_url: str,
    requests: list[BenchRequest],
    model: str | None = None,
    max_concurrency: int | None = None,
    request_rate: float = math.inf,
    seed: int = 0,
    api_key: str | None = None,
    percentiles: tuple[float, ...] = (50, 90, 99),
) -> dict:
    """Send `requests` to the server at `base_url`; return the summary dict."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # A base URL may carry a path (a proxy's prefix): the API paths go after it.
    root = base_url.rstrip("/")
    # A connection per request: with pooled connections, llama-server at 16
    # concurrent streams failed 9 of 64 requests ("Can not write request
    # body", "Server disconnected"; aiohttp retries no POST); with a fresh
    # connection each, none (the peer benchmark).
    connector = aiohttp.TCPConnector(limit=max_concurrency or len(requests) or 1, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, read_bufsize=1 << 20
    ) as client:
        if model is None:
            async with client.get(f"{root}/v1/models", headers=headers) as resp:
                resp.raise_for_status()
                model = (await resp.json())["data"][0]["id"]
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        rng = random.Random(seed)

        async def limited(req: BenchRequest) -> RequestResult:
            if sem is None:
                return await _one_request(client, f"{root}/v1/completions", model, req, headers)
            async with sem:
                return await _one_request(client, f"{root}/v1/completions", model, req, headers)

        metrics_before = await _server_histograms(client, root, headers)
        start = time.perf_counter()
        tasks = []
        for req in requests:
            tasks.append(asyncio.create_task(limited(req)))
            if request_rate != math.inf:
                # Poisson arrivals: exponential gaps with mean 1/rate.
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        split = server_split(metrics_before, await _server_histograms(client, root, headers))
    summary = summarize(list(results), duration, list(percentiles))
    if split:
        summary["server_s"] = split
    summary.update(
        model=model,
        num_prompts=len(requests),
        max_concurrency=max_concurrency,
        request_rate=None if request_rate == math.inf else request_rate,
    )
    return summary


def format_table(summary: dict) -> str:
    """The summary as a human-readable table (latencies in ms)."""
    lines = [
        f"{'Successful requests':<34}{summary['completed']:>12}",
        f"{'Failed requests':<34}{summary['failed']:>12}",
        f"{'Benchmark duration (s)':<34}{summary['duration_s']:>12.2f}",
        f"{'Total input tokens':<34}{summary['total_input_tokens']:>12}",
        f"{'Total generated tokens':<34}{summary['total_output_tokens']:>12}",
        f"{'Request throughput (req/s)':<34}{summary['request_throughput']:>12.2f}",
        f"{'Output token throughput (tok/s)':<34}{summary['output_throughput']:>12.2f}",
        f"{'Total token throughput (tok/s)':<34}{summary['total_token_throughput']:>12.2f}",
    ]
    for key, title in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        for stat, value in summary[key].items():
            lines.append(f"{f'{stat.capitalize()} {title} (ms)':<34}{value * 1000:>12.2f}")
    for key, value in summary.get("server_s", {}).items():
        title = f"Server mean {key.removesuffix('_mean')} time (ms)"
        lines.append(f"{title:<34}{value * 1000:>12.2f}")
    return "\n".join(lines)


def build_requests(ns: argparse.Namespace) -> list[BenchRequest]:
    vocab = (ns.vocab_min, ns.vocab_max)
    if ns.dataset == "random":
        return random_dataset(
            ns.num_prompts, ns.input_len, ns.output_len, ns.seed, vocab, ns.input_len_max
        )
    return shared_prefix_dataset(
        ns.num_prompts,
        ns.prefix_len,
        ns.input_len,
        ns.output_len,
        ns.num_prefixes,
        ns.seed,
        vocab,
        ns.input_len_max,
    )


def add_bench_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--base-url",
        default="http://127.0.0.1:8000",
        help="any OpenAI-compatible server (Pagoda, vLLM, llama-server)",
    )
    p.add_argument("--model", default=None, help="default: the server's first model")
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset", choices=("random", "shared-prefix"), default="random")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128, help="prompt (or suffix) tokens")
    p.add_argument(
        "--input-len-max",
        type=int,
        default=None,
        help="draw each prompt (or suffix) length uniformly from [--input-len, this]",
    )
    p.add_argument(
        "--output-len", type=int, default=64, help="tokens per request, exactly (ignore_eos)"
    )
    p.add_argument("--prefix-len", type=int, default=512, help="shared-prefix: prefix tokens")
    p.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: groups")
    p.add_argument("--vocab-min", type=int, default=100, help="lowest random token id")
    p.add_argument("--vocab-max", type=int, default=32000, help="highest random token id + 1")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=math.inf, help="req/s (Poisson)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--percentiles", default="50,90,99")
    p.add_argument("--result-file", default=None, help="write the JSON summary here")
    p.set_defaults(func=run_bench_serve)


def run_bench_serve(ns: argparse.Namespace) -> int:
    if ns.input_len_max is not None and ns.input_len_max < ns.input_len:
        print("pagoda: error: --input-len-max is below --input-len", file=sys.stderr)
        return 2
    requests = build_requests(ns)
    summary = asyncio.run(
        run_benchmark(
            ns.base_url,
            requests,
            model=ns.model,
            max_concurrency=ns.max_concurrency,
            request_rate=ns.request_rate,
            seed=ns.seed,
            api_key=ns.api_key,
            percentiles=tuple(float(p) for p in ns.percentiles.split(",")),
        )
    )
    summary["config"] = {k: v for k, v in vars(ns).items() if k != "func"}
    print(format_table(summary))
    if ns.result_file:
        with open(ns.result_file, "w") as f:
            json.dump(summary, f, indent=2, default=str)
    return 0 if summary["failed"] == 0 else 1


__all__ = ["BenchRequest", "RequestResult", "asdict", "run_benchmark", "summarize"]

if __name__ == "__main__":
    sys.exit(0)
