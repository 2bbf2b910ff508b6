"""The offline API on the real SmolLM2: sampling, n>1, stops, chat, bad input."""

import pytest
import torch
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.sampling_params import InvalidRequestError

pytestmark = pytest.mark.model


@pytest.fixture(scope="module", params=["off", "on"], ids=["sync", "async"])
def llm(request) -> LLM:
    # Every test runs on both loops: async scheduling is off by default on the
    # CPU, but the GPU runs it, and only here does it meet the whole API.
    return LLM(
        dtype="float32",
        max_model_len=256,
        max_num_seqs=16,
        kv_cache_memory_gib=0.25,
        async_scheduling=request.param,
    )


def _idle(llm: LLM) -> None:
    sched = llm.engine.engine_core.scheduler
    assert not sched.has_unfinished_requests()
    assert sched.kv_cache_manager.usage == 0.0
    assert not llm.engine.output_processor.has_unfinished_requests()


def test_outputs_come_back_in_prompt_order_with_prompt_ids(llm, smollm2_tokenizer):
    prompts = ["Hello, my name is", "The sky is", "Water boils at"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5))
    assert [o.prompt for o in outs] == prompts
    for prompt, out in zip(prompts, outs):
        assert out.prompt_token_ids == smollm2_tokenizer.encode(prompt)
        assert out.finished and len(out.outputs[0].token_ids) == 5
        assert out.outputs[0].finish_reason == "length"
    _idle(llm)


def test_token_id_prompts_equal_text_prompts(llm, smollm2_tokenizer):
    params = SamplingParams(temperature=0, max_tokens=8)
    text = llm.generate("The sky is", params)[0]
    ids = llm.generate([smollm2_tokenizer.encode("The sky is")], params)[0]
    assert ids.outputs[0].token_ids == text.outputs[0].token_ids
    assert ids.prompt is None


def test_seeded_sampling_is_reproducible_whatever_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16)
    alone = llm.generate("Tell me a story:", seeded)[0].outputs[0].token_ids
    noise = SamplingParams(temperature=1.0, max_tokens=12)
    batch = llm.generate(
        ["A", "Tell me a story:", "Some other prompt that is longer than the rest"],
        [noise, seeded, noise],
    )
    assert batch[1].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=16)
    assert llm.generate("Tell me a story:", other_seed)[0].outputs[0].token_ids != alone


def test_seeded_n2_gives_two_different_samples_that_reproduce(llm):
    params = SamplingParams(n=2, temperature=1.0, seed=11, max_tokens=12)
    first = [c.token_ids for c in llm.generate("Tell me a story:", params)[0].outputs]
    again = [c.token_ids for c in llm.generate("Tell me a story:", params)[0].outputs]
    assert first[0] != first[1]
    assert first == again


def test_seeded_sampling_survives_preemption(llm, prompts):
    seeded = SamplingParams(temperature=0.8, top_k=50, seed=2024, max_tokens=24)
    alone = llm.generate(prompts[7], seeded)[0].outputs[0].token_ids
    # 16 blocks of 16 cannot hold the batch (the seeded prompt alone takes
    # 13): requests are preempted, recomputed and resume sampling.
    tight = LLM(
        dtype="float32",
        max_num_batched_tokens=16,
        max_num_seqs=8,
        num_kv_blocks=16,
        max_model_len=256,
    )
    others = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)
    out = tight.generate(prompts, [others] * 7 + [seeded])
    assert tight.engine.engine_core.scheduler.make_stats().num_preemptions > 0
    assert out[7].outputs[0].token_ids == alone


def test_a_float16_kv_cache_holds_twice_the_tokens_and_decodes_alike(llm, prompts):
    """kv_cache_dtype float16 under float32 weights (llama.cpp's default
    cache): the same memory budget holds twice the blocks, and greedy output
    follows the float32 cache's (the rounding is ~5e-4 relative)."""
    greedy = SamplingParams(temperature=0, max_tokens=16)
    full = llm  # float32 weights and cache, the same 0.25 GiB budget
    half = LLM(
        dtype="float32",
        max_model_len=256,
        max_num_seqs=16,
        kv_cache_memory_gib=0.25,
        kv_cache_dtype="float16",
    )
    # floor(budget / half-size block) is 2 floor(budget / block) or one more.
    blocks = half.engine.engine_core.memory.num_blocks, full.engine.engine_core.memory.num_blocks
    assert blocks[0] // 2 == blocks[1]
    assert "KV cache (float16)" in half.engine.engine_core.memory.summary()
    runner = half.engine.engine_core.executor.worker.runner
    assert all(c.dtype == torch.float16 for c in runner.kv_caches)
    expected = [o.outputs[0].token_ids for o in full.generate(prompts, greedy)]
    got = [o.outputs[0].token_ids for o in half.generate(prompts, greedy)]
    assert got == expected
    _idle(half)


def test_n_samples_share_the_prompt_blocks_and_differ(llm):
    prompt = "List some animals: " + "cat, dog, " * 20
    before = llm.engine.engine_core.scheduler.make_stats().prefix_cache_hits
    out = llm.generate(prompt, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    hits = llm.engine.engine_core.scheduler.make_stats().prefix_cache_hits - before
    # Samples 2 and 3 read sample 1's full prompt blocks.
    assert hits >= 2 * (len(out.prompt_token_ids) // 16) * 16
    _idle(llm)


def test_stop_string_ends_the_output_before_it(llm):
    free = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=20))[0]
    assert " 7" in free.outputs[0].text
    out = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=20, stop=[" 7"]))[0]
    comp = out.outputs[0]
    assert comp.text == free.outputs[0].text.split(" 7")[0]
    assert comp.finish_reason == "stop" and comp.stop_reason == " 7"
    _idle(llm)


def test_stop_token_ids_and_eos_finish_with_stop(llm, smollm2_tokenizer):
    comma = smollm2_tokenizer.encode(",")[0]
    out = llm.generate(
        "1, 2, 3", SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[comma])
    )
    comp = out[0].outputs[0]
    assert comp.token_ids[-1] == comma and comp.finish_reason == "stop"
    assert comp.stop_reason == comma
    chat = llm.chat(
        [{"role": "user", "content": "Say hi."}], SamplingParams(temperature=0, max_tokens=64)
    )
    assert chat[0].outputs[0].finish_reason == "stop"  # <|im_end|> is EOS


def test_min_tokens_and_ignore_eos_run_past_eos(llm):
    msgs = [{"role": "user", "content": "Say hi."}]
    short = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    n = len(short.token_ids)
    forced = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=n + 10, min_tokens=n + 5))
    assert len(forced[0].outputs[0].token_ids) >= n + 5
    ignored = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=n + 6, ignore_eos=True))
    assert len(ignored[0].outputs[0].token_ids) == n + 6


def test_logprobs_have_top_n_and_the_sampled_token(llm):
    out = llm.generate("The sky is", SamplingParams(temperature=0, max_tokens=4, logprobs=3))[0]
    comp = out.outputs[0]
    assert len(comp.logprobs) == 4
    for tok, position in zip(comp.token_ids, comp.logprobs):
        assert tok in position and position[tok].rank == 1  # greedy takes rank 1
        assert len(position) == 3
        values = [lp.logprob for lp in position.values()]
        assert values == sorted(values, reverse=True) and values[0] <= 0
    assert comp.cumulative_logprob == pytest.approx(
        sum(p[t].logprob for t, p in zip(comp.token_ids, comp.logprobs))
    )


def test_multibyte_text_round_trips(llm):
    out = llm.generate("Le café est très", SamplingParams(temperature=0, max_tokens=12))[0]
    comp = out.outputs[0]
    tok = llm.get_tokenizer()
    assert comp.text == tok.decode(comp.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"n": 0}, "n"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, param):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert err.value.param == param
    assert param in str(err.value)


def test_bad_prompts_raise_and_the_engine_keeps_serving(llm):
    good = SamplingParams(temperature=0, max_tokens=4)
    for bad in ["", [], "word " * 400, [10**9]]:
        with pytest.raises(InvalidRequestError) as err:
            llm.generate(["fine prompt", bad], good)
        assert err.value.param == "prompt"
    _idle(llm)  # nothing of the rejected batch was submitted
    assert len(llm.generate("Still serving?", good)[0].outputs[0].token_ids) == 4


def test_unknown_model_and_unsupported_architecture_are_clear(tmp_path):
    with pytest.raises(InvalidRequestError) as err:
        LLM(model=str(tmp_path / "missing"))
    assert err.value.param == "model"
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(InvalidRequestError) as err:
        LLM(model=str(tmp_path))
    assert err.value.param == "architectures"


def test_unknown_engine_option_is_rejected():
    with pytest.raises(TypeError, match="max_num_seq"):
        LLM(max_num_seq=4)


def test_a_dropped_llm_frees_its_model_and_kv_cache():
    """An in-process engine must not freeze its caller's heap (gc.freeze
    belongs to the engine-core process): the layers' reference cycles
    (parameter -> weight_loader -> layer) would outlive the engine, ~0.6 GB
    of weights per LLM, enough to exhaust a test run that builds dozens."""
    import gc
    import weakref

    llm = LLM(
        dtype="float32",
        max_model_len=128,
        kv_cache_memory_gib=0.05,
        hf_overrides={"num_hidden_layers": 2},
    )
    llm.generate("Hello", SamplingParams(max_tokens=2))
    runner = llm.engine.engine_core.executor.worker.runner
    refs = [weakref.ref(m) for m in runner.model.modules()] + [
        weakref.ref(c) for c in runner.kv_caches
    ]
    del llm, runner
    gc.collect()
    assert [r for r in refs if r() is not None] == []
