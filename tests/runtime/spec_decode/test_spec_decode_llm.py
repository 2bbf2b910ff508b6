"""Speculative decoding on the real SmolLM2: greedy output equals greedy
without speculation token for token (n-gram; a draft model with k = 1, 3, 5),
stops and max_tokens inside an accepted run land where they do without it,
logprobs, n>1 and seeds compose, and the prefix cache is unchanged.

The draft model is the built-in SmolLM2 cut to its first 4 layers
(hf_overrides), which shares the tokenizer and proposes poorly: many
rejections, which is what exactness needs exercising. Prompts that repeat
themselves make n-gram drafts accepted, long runs of them.
"""

import pytest
import torch
from pagoda.runtime import LLM, SamplingParams

pytestmark = [pytest.mark.model, pytest.mark.slow]

# A small KV budget (8 x 256 tokens need 94 MB): CI runs this module in one
# process with up to four engines alive, each with a draft cache too.
OPTIONS = {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 8, "kv_cache_memory_gib": 0.25}
REPEATING = [
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "Copy the list exactly.\nList: red, green, blue, yellow, purple, orange.\n"
    "Copy: red, green, blue,",
]
NON_REPEATING = ["The capital of France is", "def fibonacci(n):\n    "]
PROMPTS = REPEATING + NON_REPEATING
GREEDY = SamplingParams(temperature=0, max_tokens=20)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


def draft(k: int) -> dict:
    return {
        "method": "draft_model",
        "model": "smollm2-135m-instruct",
        "num_speculative_tokens": k,
        "hf_overrides": {"num_hidden_layers": 4},
        "min_acceptance_rate": 0.0,  # keep drafting: rejections are the point
    }


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def spec_stats(llm: LLM):
    return llm.engine.engine_core.scheduler.make_stats().spec_decoding


def idle(llm: LLM) -> None:
    sched = llm.engine.engine_core.scheduler
    assert not sched.has_unfinished_requests()
    assert sched.kv_cache_manager.usage == 0.0


@pytest.fixture(scope="module")
def base() -> LLM:
    return LLM(**OPTIONS)


@pytest.fixture(scope="module")
def ngram() -> LLM:
    return LLM(speculative_config=NGRAM, **OPTIONS)


@pytest.fixture(scope="module")
def expected(base) -> list[list[int]]:
    return tokens(base.generate(PROMPTS, GREEDY))


def test_ngram_greedy_equals_no_speculation_and_accepts_on_repeating_prompts(ngram, expected):
    assert tokens(ngram.generate(PROMPTS, GREEDY)) == expected
    stats = spec_stats(ngram)
    assert stats.num_accepted_tokens > 10
    assert stats.num_accepted_tokens_per_pos[0] >= stats.num_accepted_tokens_per_pos[-1]
    idle(ngram)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_draft_model_greedy_equals_no_speculation(k, expected):
    llm = LLM(speculative_config=draft(k), **OPTIONS)
    assert tokens(llm.generate(PROMPTS, GREEDY)) == expected
    stats = spec_stats(llm)
    assert stats.num_draft_tokens > 0
    assert stats.num_accepted_tokens < stats.num_draft_tokens  # rejections happened
    idle(llm)


def test_max_tokens_and_stop_strings_inside_an_accepted_run(base, ngram):
    prompt = REPEATING[0]
    for params in (
        SamplingParams(temperature=0, max_tokens=7),
        SamplingParams(temperature=0, max_tokens=30, stop=[" 17,"]),
        SamplingParams(
            temperature=0, max_tokens=30, stop=[" 17,"], include_stop_str_in_output=True
        ),
    ):
        want = base.generate(prompt, params)[0].outputs[0]
        got = ngram.generate(prompt, params)[0].outputs[0]
        assert (got.text, got.token_ids, got.finish_reason) == (
            want.text,
            want.token_ids,
            want.finish_reason,
        )
    # The stop landed inside an accepted draft: several tokens per step.
    assert spec_stats(ngram).num_accepted_tokens > 0
    idle(ngram)


def test_stop_strings_never_stream_what_follows(ngram):
    from pagoda.runtime.engine.output_processor import OutputKind

    engine = ngram.engine
    params = SamplingParams(temperature=0, max_tokens=30, stop=[" 16,"])
    engine.add_request("s", REPEATING[0], params, kind=OutputKind.DELTA)
    text = ""
    while engine.has_unfinished_requests():
        for out in engine.step():
            text += out.outputs[0].text
    assert " 16," not in text and text.endswith("15,")


def test_logprobs_of_accepted_tokens_equal_those_without_speculation(base, ngram):
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=2)
    want = base.generate(REPEATING[0], params)[0].outputs[0]
    got = ngram.generate(REPEATING[0], params)[0].outputs[0]
    assert got.token_ids == want.token_ids
    for w, g in zip(want.logprobs, got.logprobs):
        assert list(g) == list(w)
        for t in w:
            assert g[t].logprob == pytest.approx(w[t].logprob, abs=1e-3)
            assert g[t].rank == w[t].rank


def test_n2_and_seeded_sampling_are_reproducible_whatever_the_batch(ngram):
    seeded = SamplingParams(n=2, temperature=0.8, seed=7, max_tokens=16)
    alone = [c.token_ids for c in ngram.generate(REPEATING[1], seeded)[0].outputs]
    noise = SamplingParams(temperature=1.0, max_tokens=10)
    batch = ngram.generate([NON_REPEATING[0], REPEATING[1]], [noise, seeded])
    assert [c.token_ids for c in batch[1].outputs] == alone
    assert alone[0] != alone[1]
    idle(ngram)


def test_draft_model_sampling_runs_seeded_and_mixed_with_greedy():
    # Sampling requests go through the rejection sampler with the draft's q;
    # a request's first step has no draft (and no q) yet.
    llm = LLM(speculative_config=draft(3), **OPTIONS)
    seeded = SamplingParams(temperature=0.8, seed=11, max_tokens=12)
    alone = tokens(llm.generate(REPEATING[0], seeded))
    mixed = llm.generate([NON_REPEATING[0], REPEATING[0]], [GREEDY, seeded])
    assert tokens(mixed)[1] == alone[0]
    assert spec_stats(llm).num_draft_tokens > 0
    unseeded = llm.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=8))
    assert all(len(t) == 8 for t in tokens(unseeded))
    idle(llm)


def test_prefix_cache_hits_equal_with_and_without_speculation(base, ngram):
    hits = []
    for llm in (base, ngram):
        core = llm.engine.engine_core
        assert core.scheduler.reset_prefix_cache()
        before = core.scheduler.make_stats().prefix_cache_hits
        first = tokens(llm.generate(PROMPTS, GREEDY))
        # Each prompt again, followed by its own output: the blocks written
        # during (speculative) decoding are hit too.
        again = [p + llm.get_tokenizer().decode(t) for p, t in zip(PROMPTS, first)]
        llm.generate(again, SamplingParams(temperature=0, max_tokens=2))
        hits.append(core.scheduler.make_stats().prefix_cache_hits - before)
    assert hits[0] == hits[1] > 0


def test_a_draft_model_over_a_float16_kv_cache_stays_exact():
    """kv_cache_dtype reaches the draft's cache too (one block table serves
    both): greedy output equals the same engine's without speculation."""
    options = {**OPTIONS, "kv_cache_dtype": "float16"}
    plain = tokens(LLM(**options).generate(PROMPTS, GREEDY))
    llm = LLM(speculative_config=draft(3), **options)
    runner = llm.engine.engine_core.executor.worker.runner
    caches = runner.kv_caches + runner.spec.proposer.kv_caches
    assert len(caches) == 30 + 4 and {c.dtype for c in caches} == {torch.float16}
    assert tokens(llm.generate(PROMPTS, GREEDY)) == plain
    assert spec_stats(llm).num_draft_tokens > 0
    idle(llm)
