"""Speculative decoding with a LoRA request: the proposer ignores the
adapter, verification applies it, so greedy output equals the adapter's
greedy output without speculation."""

import pytest
from pagoda.runtime import LLM, LoRARequest, SamplingParams

pytestmark = [pytest.mark.model, pytest.mark.slow]

PROMPTS = ["1, 2, 3, 4, 5, 6, 7, 8,", "The capital of France is"]
GREEDY = SamplingParams(temperature=0, max_tokens=12)
OPTIONS = {
    "dtype": "float32",
    "max_model_len": 256,
    "enable_lora": True,
    "max_lora_rank": 8,
    "kv_cache_memory_gib": 0.25,
}


def test_verification_applies_the_adapter(smollm2_adapters):
    lora = LoRARequest("alpha", 1, str(smollm2_adapters["alpha"][0]))
    outputs = []
    for spec in (None, {"method": "ngram", "num_speculative_tokens": 3}):
        llm = LLM(speculative_config=spec, **OPTIONS)
        with_lora = llm.generate(PROMPTS, GREEDY, lora_request=lora)
        base = llm.generate(PROMPTS, GREEDY)
        outputs.append(
            ([o.outputs[0].token_ids for o in with_lora], [o.outputs[0].token_ids for o in base])
        )
    assert outputs[0] == outputs[1]
    assert outputs[0][0] != outputs[0][1]  # the adapter does change the output
