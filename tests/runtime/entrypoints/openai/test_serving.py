"""The OpenAI-compatible server against the official `openai` client, on the
real SmolLM2: outputs equal the offline `LLM` API on the same inputs."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from pagoda.runtime.sampling_params import SamplingParams

MODEL = "smollm2-135m-instruct"
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "1, 2, 3, 4, 5,"]
CHAT = [{"role": "user", "content": "Name three primary colours."}]

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(["--served-model-name", MODEL])


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def aclient(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def wait_idle(server, timeout: float = 20.0) -> dict[str, float]:
    """Poll /metrics until no request runs or waits and no KV block is held."""
    label = f'{{model_name="{MODEL}"}}'
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        idle = (
            m[f"vllm:num_requests_running{label}"] == 0
            and m[f"vllm:num_requests_waiting{label}"] == 0
            and m[f"vllm:kv_cache_usage_perc{label}"] == 0
        )
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def test_completions_greedy_equal_offline_with_exact_usage(client, offline_llm):
    resp = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=16, temperature=0)
    ref = offline_llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16))
    assert [c.text for c in resp.choices] == [r.outputs[0].text for r in ref]
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert resp.usage.prompt_tokens == sum(len(r.prompt_token_ids) for r in ref)
    assert resp.usage.completion_tokens == sum(len(r.outputs[0].token_ids) for r in ref)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_streamed_completion_equals_unstreamed_with_usage_chunk(client):
    kwargs = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=20, temperature=0)
    whole = client.completions.create(**kwargs)
    chunks = list(
        client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_equals_offline_chat_streamed_and_not(client, offline_llm):
    ref = offline_llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=24))[0]
    resp = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=24, temperature=0
    )
    assert resp.choices[0].message.content == ref.outputs[0].text
    assert resp.choices[0].message.role == "assistant"
    assert resp.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert resp.usage.completion_tokens == len(ref.outputs[0].token_ids)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        ref.outputs[0].text
    )
    assert chunks[-1].usage.completion_tokens == resp.usage.completion_tokens


def test_text_content_parts_render_like_a_string(client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name three primary colours."}]}]
    a = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=8, temperature=0)
    b = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_seeded_n2_is_reproducible_and_equals_offline(client, offline_llm):
    kwargs = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0.9, n=2, seed=7)
    first = client.completions.create(**kwargs)
    second = client.completions.create(**kwargs)
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in second.choices]
    assert texts[0] != texts[1]  # one seed, yet two samples: each child draws its own
    assert [c.index for c in first.choices] == [0, 1]
    ref = offline_llm.generate(
        PROMPTS[0], SamplingParams(temperature=0.9, max_tokens=12, n=2, seed=7)
    )[0]
    assert texts == [o.text for o in ref.outputs]
    assert first.usage.completion_tokens == sum(len(o.token_ids) for o in ref.outputs)


def test_stop_string_ends_the_choice_like_offline(client, offline_llm):
    greedy = client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=16, temperature=0)
    stop = greedy.choices[0].text.split()[2]  # a word the greedy output contains
    resp = client.completions.create(
        model=MODEL, prompt=PROMPTS[2], max_tokens=16, temperature=0, stop=[stop]
    )
    ref = offline_llm.generate(
        PROMPTS[2], SamplingParams(temperature=0, max_tokens=16, stop=[stop])
    )
    choice = resp.choices[0]
    assert choice.text == ref[0].outputs[0].text and stop not in choice.text
    assert choice.finish_reason == "stop"
    streamed = client.completions.create(
        model=MODEL, prompt=PROMPTS[2], max_tokens=16, temperature=0, stop=[stop], stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == choice.text


def test_completion_logprobs_match_offline(client, offline_llm):
    resp = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=5, temperature=0, logprobs=2
    )
    ref = offline_llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=5, logprobs=2))
    out = ref[0].outputs[0]
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    expected = [out.logprobs[i][t].logprob for i, t in enumerate(out.token_ids)]
    assert lp.token_logprobs == pytest.approx(expected, abs=1e-4)
    assert "".join(lp.tokens) == resp.choices[0].text
    # Greedy: the sampled token is the most likely one.
    assert all(
        max(top.values()) == pytest.approx(v, abs=1e-6)
        for top, v in zip(lp.top_logprobs, lp.token_logprobs)
    )


def test_chat_logprobs_with_top_logprobs(client):
    resp = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    assert "".join(e.token for e in content) == resp.choices[0].message.content


def test_token_id_prompt_and_echo(client, server):
    ids = httpx.post(server.url + "/tokenize", json={"prompt": PROMPTS[0]}).json()["tokens"]
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    by_text = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)
    echoed = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0, echo=True
    )
    assert echoed.choices[0].text == PROMPTS[0] + by_text.choices[0].text


def test_models_version_tokenize_detokenize(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert httpx.get(server.url + "/version").json()["version"]
    tok = httpx.post(
        server.url + "/tokenize", json={"model": MODEL, "prompt": "Hello world"}
    ).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 1024
    detok = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}).json()
    assert detok["prompt"].endswith("Hello world")
    chat_tok = httpx.post(server.url + "/tokenize", json={"messages": CHAT}).json()
    resp = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
    assert chat_tok["count"] == resp.usage.prompt_tokens


async def test_32_concurrent_streams_complete_with_exact_usage(aclient, server):
    async def one(i: int):
        stream = await aclient.completions.create(
            model=MODEL,
            prompt=f"Story number {i}: once upon a time",
            max_tokens=16,
            temperature=0.8,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = [c async for c in stream]
        return chunks

    results = await asyncio.gather(*(one(i) for i in range(32)))
    for chunks in results:
        usage = chunks[-1].usage
        assert usage.completion_tokens == 16
        assert usage.total_tokens == usage.prompt_tokens + 16
        assert chunks[-2].choices[0].finish_reason == "length"
    m = wait_idle(server)
    label = f'{{model_name="{MODEL}"}}'
    assert m[f"vllm:num_requests_running{label}"] == 0
    assert m[f"vllm:kv_cache_usage_perc{label}"] == 0
    assert m[f"vllm:generation_tokens_total{label}"] >= 32 * 16


def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    label = f'{{model_name="{MODEL}"}}'
    aborted_before = server.metrics().get(
        f'vllm:request_success_total{{finished_reason="abort",model_name="{MODEL}"}}', 0
    )
    body = {
        "model": MODEL,
        "prompt": PROMPTS[0],
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as resp:
        lines = resp.iter_lines()
        got = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
        assert got
        m = server.metrics()
        assert m[f"vllm:num_requests_running{label}"] == 1
        assert m[f"vllm:kv_cache_usage_perc{label}"] > 0
    m = wait_idle(server)
    assert m[f"vllm:num_requests_running{label}"] == 0
    assert m[f"vllm:kv_cache_usage_perc{label}"] == 0
    aborted = m[f'vllm:request_success_total{{finished_reason="abort",model_name="{MODEL}"}}']
    assert aborted == aborted_before + 1


def test_disconnect_while_waiting_for_a_plain_response_aborts(server):
    label = f'{{model_name="{MODEL}"}}'
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=1.5)
    m = wait_idle(server)
    assert m[f"vllm:num_requests_running{label}"] == 0
    assert m[f"vllm:kv_cache_usage_perc{label}"] == 0


def test_metrics_have_vllm_names_labelled_by_model(server):
    text = httpx.get(server.url + "/metrics").text
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:request_time_per_output_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket",
        "vllm:request_inference_time_seconds_bucket",
        "vllm:request_prefill_time_seconds_bucket",
        "vllm:request_decode_time_seconds_bucket",
        "pagoda:requests_received_total",
        "vllm:request_prompt_tokens_bucket",
        "vllm:request_generation_tokens_bucket",
    ]:
        assert f"{name}{{" in text, name
    assert f'vllm:request_success_total{{finished_reason="length",model_name="{MODEL}"}}' in text
    # Shared prompts (the same prompt sent several times above) hit the prefix cache.
    hits = [line for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits_total")]
    assert float(hits[0].split()[-1]) > 0
    json.dumps(text)  # plain text, no binary
