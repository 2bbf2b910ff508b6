"""The offline engine reproduces transformers' greedy outputs token for token
on the real SmolLM2, whatever the batching, budget, preemption or caching."""

import pytest
from pagoda.runtime import LLM, SamplingParams

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, min_tokens=24)


def _tokens(llm: LLM, prompts: list[str]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


def _no_leak(llm: LLM) -> None:
    sched = llm.engine.engine_core.scheduler
    assert not sched.has_unfinished_requests()
    mgr = sched.kv_cache_manager
    assert mgr.usage == 0.0


@pytest.mark.slow
def test_large_budget_matches_transformers(hf_greedy, prompts):
    llm = LLM(dtype="float32", max_num_batched_tokens=4096, max_model_len=512)
    assert _tokens(llm, prompts) == hf_greedy
    _no_leak(llm)


@pytest.mark.slow
def test_tiny_budget_with_chunked_prefill_and_preemption_matches_transformers(hf_greedy, prompts):
    # 16 tokens a step forces every prompt of more than 16 tokens through
    # several chunks; 16 blocks of 16 cannot hold the batch (the long prompt
    # alone takes 13),
    # so requests are preempted and recomputed.
    llm = LLM(
        dtype="float32",
        max_num_batched_tokens=16,
        max_num_seqs=8,
        num_kv_blocks=16,
        max_model_len=256,
    )
    assert _tokens(llm, prompts) == hf_greedy
    assert llm.engine.engine_core.scheduler.make_stats().num_preemptions > 0
    _no_leak(llm)


@pytest.mark.slow
def test_prefix_caching_on_and_off_match_transformers(hf_greedy, prompts):
    for caching in (True, False):
        llm = LLM(dtype="float32", enable_prefix_caching=caching, max_model_len=512)
        assert _tokens(llm, prompts) == hf_greedy
        # The same batch again: with caching the prompts' full blocks hit.
        assert _tokens(llm, prompts) == hf_greedy
        stats = llm.engine.engine_core.scheduler.make_stats()
        assert (stats.prefix_cache_hits > 0) == caching
        _no_leak(llm)
