"""A request's life in the API process, in-process against a real EngineCore
(SmolLM2): one merged pending output per request, the pending count, no leak
when a stream is cut at any point, no request blocked behind a long prompt's
tokenization, and a 500 that keeps the connection.

max_num_seqs is 1 here, so a second request waits in the core: leaks show as
requests left running or waiting, and as output collectors left behind.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import pytest_asyncio
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.engine.async_llm import LONG_PROMPT_CHARS, AsyncLLM
from pagoda.runtime.engine.output_processor import OutputKind
from pagoda.runtime.entrypoints.openai.api_server import ServerConfig, build_app
from pagoda.runtime.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from pagoda.runtime.entrypoints.openai.serving_chat import OpenAIServingChat
from pagoda.runtime.entrypoints.openai.serving_completions import OpenAIServingCompletion
from pagoda.runtime.entrypoints.openai.serving_engine import ServingConfig
from pagoda.runtime.sampling_params import InvalidRequestError, SamplingParams

MODEL = "smollm2-135m-instruct"
CHAT = [{"role": "user", "content": "Tell me a long story."}]
LONG = {"max_tokens": 900, "ignore_eos": True}

pytestmark = [pytest.mark.model, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(
    scope="module", loop_scope="module", params=["off", "on"], ids=["sync", "async"]
)
async def engine(smollm2_available, request):
    # Async scheduling (the CUDA default) keeps a step in flight in the core:
    # every leak window here is checked with it too.
    args = EngineArgs(
        model=MODEL,
        dtype="float32",
        max_model_len=1024,
        kv_cache_memory_gib=0.25,
        max_num_seqs=1,
        async_scheduling=request.param,
    )
    engine = await AsyncLLM.create(args, num_threads=1)
    yield engine
    await engine.shutdown()


@pytest.fixture(scope="module")
def chat(engine) -> OpenAIServingChat:
    return OpenAIServingChat(engine, ServingConfig(MODEL))


@pytest.fixture(scope="module")
def completions(engine) -> OpenAIServingCompletion:
    return OpenAIServingCompletion(engine, ServingConfig(MODEL))


async def wait_until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def assert_nothing_left(engine: AsyncLLM) -> None:
    """No request runs or waits in the core, and none is held here."""

    def idle() -> bool:
        stats = engine.scheduler_stats
        return (
            stats.num_running_reqs == 0
            and stats.num_waiting_reqs == 0
            and engine.num_requests == 0
            and not engine.output_processor.parents
        )

    await wait_until(idle, 30, "the engine to be idle with no request held")


async def collect(engine: AsyncLLM, handle, timeout: float = 60.0) -> list:
    async def run():
        return [out async for out in engine.outputs(handle)]

    return await asyncio.wait_for(run(), timeout)


# -- back-pressure -----------------------------------------------------------------


async def test_a_slow_reader_finds_one_merged_output_not_one_per_step(engine):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    eager = await collect(engine, await engine.add_request("eager", "Once upon a time", params))
    assert len(eager) > 1
    slow = await engine.add_request("slow", "Once upon a time", params, OutputKind.DELTA)
    # The request finishes in the engine while nobody reads its outputs.
    await wait_until(lambda: "slow" not in engine.output_processor.parents, what="the request")
    outs = await collect(engine, slow)
    assert len(outs) == 1
    merged = outs[0]
    assert merged.finished and merged.outputs[0].finish_reason == "length"
    assert len(merged.outputs[0].token_ids) == 12
    assert merged.outputs[0].token_ids == [t for o in eager for t in o.outputs[0].token_ids]
    assert merged.outputs[0].text == "".join(o.outputs[0].text for o in eager)
    await assert_nothing_left(engine)


async def test_requests_being_tokenized_count_as_pending(engine, monkeypatch):
    gate = threading.Event()
    real = engine.processor.process

    def held_process(*args, **kwargs):
        gate.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.processor, "process", held_process)
    assert engine.num_pending == 0
    params = SamplingParams(n=2, max_tokens=2)
    task = asyncio.ensure_future(engine.add_request("pending", "Hello", params))
    # Two samples are two engine-core requests, as the core's waiting count has it.
    await wait_until(lambda: engine.num_pending == 2, 10, "the pending count")
    gate.set()
    handle = await asyncio.wait_for(task, 30)
    assert engine.num_pending == 0
    await collect(engine, handle)
    await assert_nothing_left(engine)


# -- disconnect leak windows ------------------------------------------------------------


async def test_a_stream_cut_before_its_first_chunk_aborts_its_request(engine, chat):
    body = ChatCompletionRequest(messages=CHAT, stream=True, **LONG)
    response = await chat.create_chat_completion(body, None)
    assert engine.num_requests == 1
    socket_blocked = asyncio.Event()  # never set: the first send never completes

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        await socket_blocked.wait()

    scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST", "headers": []}
    # The client is gone before anything was sent: the body generator never runs.
    await asyncio.wait_for(response(scope, receive, send), 10)
    await assert_nothing_left(engine)


async def test_a_stream_cut_between_the_role_chunk_and_the_first_token_aborts(engine, chat):
    body = ChatCompletionRequest(messages=CHAT, stream=True, n=2, **LONG)
    response = await chat.create_chat_completion(body, None)
    chunks = response.body_iterator
    first = await asyncio.wait_for(anext(chunks), 10)
    assert '"role":"assistant"' in first
    await chunks.aclose()  # the client left right after the role chunk
    await assert_nothing_left(engine)


async def test_a_refused_prompt_of_a_batch_leaves_nothing_behind(engine, completions):
    # The first prompt is submitted, the second is too long: all or none.
    body = CompletionRequest(prompt=["Hello", "word " * 2000], **LONG)
    with pytest.raises(InvalidRequestError) as refused:
        await completions.create_completion(body, None)
    assert refused.value.param == "prompt"
    await assert_nothing_left(engine)


async def test_a_failed_sample_of_an_n2_request_leaves_nothing_behind(engine, monkeypatch):
    real = engine.client.add_request
    sent = []

    async def second_send_fails(req):
        sent.append(req.request_id)
        if len(sent) == 2:
            raise ConnectionError("the engine core's socket failed")
        await real(req)

    monkeypatch.setattr(engine.client, "add_request", second_send_fails)
    with pytest.raises(ConnectionError):
        await engine.add_request("partial", "Hello", SamplingParams(n=2, **LONG))
    monkeypatch.undo()
    assert len(sent) == 2  # the first sample reached the core
    await assert_nothing_left(engine)


async def test_a_duplicate_request_id_keeps_the_first_requests_outputs(engine):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = await engine.add_request("dup", "Hello", params)
    with pytest.raises(ValueError, match="already in use"):
        await engine.add_request("dup", "Hi there", params)
    outs = await collect(engine, first, 30)
    assert outs[-1].finished
    assert sum(len(o.outputs[0].token_ids) for o in outs) == 6
    await assert_nothing_left(engine)


# -- requests that can never fit -------------------------------------------------------------


async def test_samples_that_can_never_share_the_kv_cache_are_a_permanent_400(engine):
    info = engine.client.info
    capacity = info.num_kv_blocks * info.block_size
    n = capacity // 900 + 2  # each sample may grow to 900 tokens: n of them never fit
    with pytest.raises(InvalidRequestError, match="KV cache") as refused:
        await engine.add_request("huge", "Hello", SamplingParams(n=n, max_tokens=900))
    assert refused.value.param == "n"
    # The same samples, shorter, fit: accepted.
    handle = await engine.add_request("fits", "Hello", SamplingParams(n=n, max_tokens=2))
    assert (await collect(engine, handle))[-1].finished
    await assert_nothing_left(engine)


# -- head-of-line blocking -----------------------------------------------------------------


async def test_a_short_prompt_is_not_held_behind_a_long_prompts_tokenization(engine, monkeypatch):
    long_started, release_long = threading.Event(), threading.Event()
    real = engine.processor.process

    def slow_for_long_prompts(request_id, prompt, *args, **kwargs):
        if isinstance(prompt, str) and len(prompt) > LONG_PROMPT_CHARS:
            long_started.set()
            release_long.wait(30)  # a tokenization that takes a long time
        return real(request_id, prompt, *args, **kwargs)

    monkeypatch.setattr(engine.processor, "process", slow_for_long_prompts)
    params = SamplingParams(temperature=0, max_tokens=2)
    long_prompt = "word " * (LONG_PROMPT_CHARS // 5 + 10)
    long_task = asyncio.ensure_future(engine.add_request("long", long_prompt, params))
    await wait_until(long_started.is_set, 10, "the long prompt's tokenization")
    try:
        short = await asyncio.wait_for(engine.add_request("short", "Hi", params), 10)
        assert (await collect(engine, short))[-1].finished
    finally:
        release_long.set()
    # (The long prompt has more tokens than the context: refused after tokenizing.)
    with pytest.raises(InvalidRequestError):
        await asyncio.wait_for(long_task, 30)
    await assert_nothing_left(engine)


# -- unexpected errors ------------------------------------------------------------------------


async def test_an_unexpected_error_is_a_500_and_the_connection_survives(
    engine, monkeypatch, unused_tcp_port
):
    import uvicorn

    app = build_app(engine, ServerConfig(served_model_name=MODEL, max_waiting_requests=None))
    config = uvicorn.Config(app, host="127.0.0.1", port=unused_tcp_port, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    try:
        await wait_until(lambda: server.started, 30, "uvicorn")

        async def broken(self, body, raw):
            raise RuntimeError("a bug in a handler")

        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{unused_tcp_port}", limits=limits, timeout=60
        ) as client:
            with monkeypatch.context() as patch:
                patch.setattr(OpenAIServingCompletion, "create_completion", broken)
                failed = await client.post("/v1/completions", json=body)
            assert failed.status_code == 500
            error = failed.json()["error"]
            assert error["type"] == "InternalServerError" and error["code"] == 500
            assert "a bug in a handler" not in error["message"]  # no internals leak
            first_conn = failed.extensions["network_stream"].get_extra_info("client_addr")
            await asyncio.sleep(0.5)  # time for a close to arrive, if the server closed
            ok = await client.post("/v1/completions", json=body)
            assert ok.status_code == 200, ok.text
            assert ok.extensions["network_stream"].get_extra_info("client_addr") == first_conn
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
