"""Async scheduling end to end: step N+1 is launched before step N's tokens
reach the host, its input ids taken from N's sampled tokens on the device.
Whatever the batch does (requests finishing at different steps, preemption,
seeded draws, penalties, logprobs), every request gets the tokens the
synchronous loop gives it, and the engine ends idle with nothing held."""

import gc

import pytest
import torch
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.config import resolve_async_scheduling
from pagoda.runtime.sampling_params import InvalidRequestError

# SmolLM2's shape cut to 2 layers and a 512-token vocabulary, random weights.
TINY = dict(
    model="smollm2-135m",
    random_weights=True,
    hf_overrides={"num_hidden_layers": 2, "vocab_size": 512},
    max_model_len=256,
    max_num_seqs=8,
)
PROMPTS = [[(3 + i + 5 * j) % 500 for j in range(4 + 11 * i)] for i in range(10)]

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ),
]


def mixed_params() -> list[SamplingParams]:
    """One per prompt: greedy, seeded draws, penalties, logprobs, min_tokens,
    and output lengths that end requests at different steps."""
    out = []
    for i in range(len(PROMPTS)):
        kind = i % 5
        common = dict(max_tokens=6 + 5 * i, ignore_eos=True)
        if kind == 0:
            out.append(SamplingParams(temperature=0, **common))
        elif kind == 1:
            out.append(SamplingParams(temperature=0.9, top_p=0.8, seed=100 + i, **common))
        elif kind == 2:
            out.append(
                SamplingParams(
                    temperature=0,
                    presence_penalty=0.5,
                    frequency_penalty=0.3,
                    repetition_penalty=1.2,
                    **common,
                )
            )
        elif kind == 3:
            out.append(SamplingParams(temperature=0, logprobs=2, **common))
        else:
            out.append(SamplingParams(temperature=1.0, seed=7 * i, min_tokens=4, **common))
    return out


def run(device: str, mode: str, **options) -> tuple[list, list]:
    llm = LLM(device=device, dtype="float32", async_scheduling=mode, **TINY, **options)
    core = llm.engine.engine_core
    assert core.async_scheduling == (mode == "on")
    outs = [o.outputs[0] for o in llm.generate(PROMPTS, mixed_params())]
    # A step may still be in flight for requests already finished: the next
    # call of the loop drains it, and then nothing is held.
    while core.has_unfinished_requests():
        core.step()
    sched = core.scheduler
    assert sched.kv_cache_manager.num_free_blocks == sched.kv_cache_manager.num_blocks
    assert core.executor.worker.runner._in_flight is None
    preemptions = sched.num_preemptions
    del llm, core, sched
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return outs, [preemptions]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_kv_blocks", [256, 24], ids=["roomy", "preempting"])
def test_async_gives_every_request_the_sync_tokens(device, num_kv_blocks):
    options = dict(num_kv_blocks=num_kv_blocks)
    if device == "cuda":
        options.update(attention_backend="triton", gpu_memory_utilization=0.3)
    sync, sync_preempted = run(device, "off", **options)
    overlapped, async_preempted = run(device, "on", **options)
    if num_kv_blocks == 24:
        assert sync_preempted[0] > 0 and async_preempted[0] > 0
    for params, a, b in zip(mixed_params(), sync, overlapped):
        assert len(b.token_ids) == params.max_tokens
        assert b.token_ids == a.token_ids
        if params.logprobs:
            la = [d[t].logprob for d, t in zip(a.logprobs, a.token_ids)]
            lb = [d[t].logprob for d, t in zip(b.logprobs, b.token_ids)]
            assert lb == pytest.approx(la, abs=1e-4)


def test_auto_turns_async_on_only_where_it_can_overlap():
    assert resolve_async_scheduling("auto", "cuda", 1, False)
    assert not resolve_async_scheduling("auto", "cpu", 1, False)
    assert not resolve_async_scheduling("auto", "cuda", 2, False)
    assert not resolve_async_scheduling("auto", "cuda", 1, True)
    assert not resolve_async_scheduling("off", "cuda", 1, False)
    assert resolve_async_scheduling("on", "cpu", 1, False)


@pytest.mark.parametrize(
    ("tp", "spec", "named"),
    [(2, False, "tensor_parallel_size 2"), (1, True, "speculative decoding")],
)
def test_async_on_is_refused_where_the_engine_cannot_overlap(tp, spec, named):
    with pytest.raises(InvalidRequestError, match=named) as err:
        resolve_async_scheduling("on", "cuda", tp, spec)
    assert err.value.param == "async_scheduling"


def test_a_bad_async_scheduling_value_names_the_field():
    with pytest.raises(InvalidRequestError, match="async_scheduling must be one of") as err:
        LLM(async_scheduling="maybe")
    assert err.value.param == "async_scheduling"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_step_synchronises_the_host_with_the_device():
    """Async scheduling only overlaps if launching a step never waits for the
    device: any synchronising op in a step (a pageable copy, .item(), a
    nonzero) would make the host wait for the step in flight. torch's sync
    debug mode turns each into an error, here over chunked prefills mixed
    with decodes (eager steps) and decode-only steps (graph replays)."""
    llm = LLM(
        device="cuda",
        dtype="bfloat16",
        **TINY,
        max_num_batched_tokens=64,
        async_scheduling="on",
        attention_backend="triton",
        gpu_memory_utilization=0.3,
    )
    runner = llm.engine.engine_core.executor.worker.runner
    inner = runner.execute_model
    resolve = runner.resolve_in_flight

    def strict(so):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return inner(so)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    def waits_on_purpose():
        # Reading the previous step's tokens is the one deliberate wait.
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("default")
        try:
            resolve()
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    runner.execute_model = strict
    runner.resolve_in_flight = waits_on_purpose
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    assert all(len(o.outputs[0].token_ids) == 24 for o in outs)
