"""`pagoda bench serve`: the workloads (seeded, exact lengths, ranges
honoured) and the client, against a scripted SSE server that streams the way
Pagoda and llama-server do, or fails."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from aiohttp import web
from kubesim.http import serve_app
from pagoda.runtime.entrypoints.bench_serve import (
    BenchRequest,
    format_table,
    parse_histogram_totals,
    random_dataset,
    run_benchmark,
    shared_prefix_dataset,
)

VOCAB = (100, 32000)


def test_random_dataset_fixed_length_is_exact():
    reqs = random_dataset(8, 17, 5, 0, VOCAB)
    assert [len(r.prompt_token_ids) for r in reqs] == [17] * 8
    assert all(r.output_len == 5 for r in reqs)


def test_random_dataset_lengths_stay_in_range_and_vary():
    reqs = random_dataset(64, 32, 4, 0, VOCAB, input_len_max=512)
    lengths = [len(r.prompt_token_ids) for r in reqs]
    assert min(lengths) >= 32 and max(lengths) <= 512
    assert len(set(lengths)) > 10


def test_random_dataset_is_seeded():
    a = random_dataset(4, 8, 4, 3, VOCAB, input_len_max=64)
    b = random_dataset(4, 8, 4, 3, VOCAB, input_len_max=64)
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
    assert all(VOCAB[0] <= t < VOCAB[1] for r in a for t in r.prompt_token_ids)


def test_shared_prefix_dataset_shares_the_prefix_and_varies_the_suffix():
    reqs = shared_prefix_dataset(8, 384, 32, 16, 2, 1, VOCAB, suffix_len_max=128)
    prefixes = {tuple(r.prompt_token_ids[:384]) for r in reqs}
    assert len(prefixes) == 2
    assert reqs[0].prompt_token_ids[:384] == reqs[2].prompt_token_ids[:384]
    assert all(32 <= len(r.prompt_token_ids) - 384 <= 128 for r in reqs)


def _event(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def _token(text: str, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}


@contextlib.asynccontextmanager
async def scripted_server(aiohttp_events, path_prefix: str = "", metrics=None):
    """A server whose /v1/completions streams `aiohttp_events(body)`: a list
    of byte strings (each written as one HTTP chunk) or an int status, and
    with `metrics`, a /metrics answering `metrics(requests seen)`.
    Yields its base URL and the request bodies it has seen."""
    seen: list[dict] = []

    async def metrics_page(request):
        return web.Response(text=metrics(len(seen)))

    async def models(request):
        return web.json_response({"data": [{"id": "scripted"}]})

    async def completions(request):
        body = await request.json()
        seen.append(body)
        script = aiohttp_events(body)
        if isinstance(script, int):
            return web.Response(status=script, text="refused")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in script:
            await resp.write(piece)
            await asyncio.sleep(0.002)
        return resp

    app = web.Application()
    app.router.add_get(f"{path_prefix}/v1/models", models)
    app.router.add_post(f"{path_prefix}/v1/completions", completions)
    if metrics is not None:
        app.router.add_get(f"{path_prefix}/metrics", metrics_page)
    async with serve_app(app) as base_url:
        yield f"{base_url}{path_prefix}", seen


def _requests(n: int, output_len: int) -> list[BenchRequest]:
    return [BenchRequest([101 + i, 102, 103], output_len) for i in range(n)]


@pytest.mark.parametrize("path_prefix", ["", "/proxy/pagoda"])
async def test_client_counts_tokens_and_times_them(path_prefix):
    def script(body):
        n = body["max_tokens"]
        events = [_event(_token(f"t{i}")) for i in range(n - 1)]
        events.append(_event(_token("end", "length")))
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
        # An event split across two HTTP chunks, as a proxy may send it.
        usage_event = _event({"choices": [], "usage": usage})
        events += [usage_event[:9], usage_event[9:], b"data: [DONE]\n\n"]
        return events

    async with scripted_server(script, path_prefix) as (url, seen):
        summary = await run_benchmark(url, _requests(4, 5), max_concurrency=2)
    assert summary["completed"] == 4 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 20
    assert summary["total_input_tokens"] == 12
    assert summary["model"] == "scripted"
    assert all(b["stream"] and b["ignore_eos"] and b["max_tokens"] == 5 for b in seen)
    assert summary["ttft_s"]["mean"] > 0
    # Four gaps of at least the server's 2 ms sleep between five tokens.
    assert summary["itl_s"]["median"] >= 0.0015
    assert summary["tpot_s"]["mean"] >= 0.0015


def _histograms(served: int) -> str:
    """vLLM's exposition after `served` requests of 10 ms queue, 20 ms
    prefill and 300 ms decode each, split over two models, with 5 requests
    from before the run (100 ms each)."""
    lines = ["# TYPE vllm:request_queue_time_seconds histogram"]
    for name, each in (("queue", 0.01), ("prefill", 0.02), ("decode", 0.3)):
        series = f"vllm:request_{name}_time_seconds"
        for model, n in (("a", served // 2), ("b", served - served // 2)):
            label = f'{{model_name="{model}"}}'
            extra = 5 if model == "a" else 0
            lines += [
                f'{series}_bucket{{le="+Inf",model_name="{model}"}} {n + extra}',
                f"{series}_sum{label} {n * each + extra * 0.1}",
                f"{series}_count{label} {n + extra}",
            ]
    lines.append("vllm:request_queue_time_seconds_summary_like_sum 99")  # another name
    return "\n".join(lines) + "\n"


async def test_client_reads_the_servers_split_of_its_requests_time():
    def script(body):
        return [_event(_token("a")), _event(_token("b", "length")), b"data: [DONE]\n\n"]

    async with scripted_server(script, metrics=_histograms) as (url, _):
        summary = await run_benchmark(url, _requests(4, 2), model="m")
    split = summary["server_s"]
    # Only this run's 4 requests, both models summed; not the 5 from before.
    assert split["queue_mean"] == pytest.approx(0.01)
    assert split["prefill_mean"] == pytest.approx(0.02)
    assert split["decode_mean"] == pytest.approx(0.3)
    assert "Server mean prefill time (ms)" in format_table(summary)


async def test_a_server_without_metrics_gives_no_split():
    def script(body):
        return [_event(_token("a", "length")), b"data: [DONE]\n\n"]

    async with scripted_server(script) as (url, _):
        summary = await run_benchmark(url, _requests(2, 1), model="m")
    assert "server_s" not in summary
    assert "Server mean" not in format_table(summary)


def test_histogram_totals_read_labels_timestamps_and_refuse_a_malformed_exposition():
    # A label value with a space and a brace, and a sample with a timestamp.
    text = 'vllm:request_queue_time_seconds_sum{model_name="a} b"} 1.5 1700000000000\n'
    text += "vllm:request_queue_time_seconds_count 3\n"
    text += 'vllm:request_queue_time_seconds_bucket{le="+Inf"} 3\n'
    assert parse_histogram_totals(text) == {"queue": (1.5, 3.0)}
    assert parse_histogram_totals(text + "vllm:request_queue_time_seconds_count NaNx\n") == {}


async def test_client_skips_llama_servers_closing_chunk_and_counts_without_usage():
    def script(body):
        events = [_event(_token("a")), _event(_token("b")), _event(_token("c"))]
        # llama-server: a last chunk with no text, only the finish reason, and no usage.
        return [*events, _event(_token("", "length")), b"data: [DONE]\n\n"]

    async with scripted_server(script) as (url, _):
        summary = await run_benchmark(url, _requests(2, 3), model="m")
    assert summary["completed"] == 2
    assert summary["total_output_tokens"] == 6


@pytest.mark.parametrize(
    "script, error",
    [
        (lambda body: 503, "HTTP 503"),
        (lambda body: [_event({"error": {"message": "engine died"}})], "engine died"),
        (lambda body: [b"data: {not json\n\n"], "JSONDecodeError"),
        (lambda body: [b"data: [DONE]\n\n"], "no tokens"),
    ],
)
async def test_client_reports_failures_per_request(script, error):
    async with scripted_server(script) as (url, _):
        summary = await run_benchmark(url, _requests(3, 4), model="m")
    assert summary["completed"] == 0 and summary["failed"] == 3
    assert any(error in e for e in summary["errors"]), summary["errors"]


async def test_client_reports_a_server_that_hangs_up_mid_stream():
    def script(body):
        return [_event(_token("a"))]  # then the handler ends without [DONE]

    async with scripted_server(script) as (url, _):
        summary = await run_benchmark(url, _requests(1, 4), model="m")
    # The stream ended cleanly after one token: one token counted, not four.
    assert summary["completed"] == 1
    assert summary["total_output_tokens"] == 1
