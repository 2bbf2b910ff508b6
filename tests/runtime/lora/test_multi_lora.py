"""Multi-LoRA on the real SmolLM2: outputs equal transformers + peft, a mixed
batch equals each request alone, the prefix cache never crosses adapters,
more adapters than slots all finish, and LoRA on but unused changes nothing."""

import pytest
import torch
from pagoda.runtime import LLM, LoRARequest, SamplingParams
from pagoda.runtime.lora.peft import AdapterError

pytestmark = pytest.mark.model

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    " ".join(f"Item {i} is a fruit called apple number {i}." for i in range(6)) + " Summary:",
]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
OPTIONS = {
    "dtype": "float32",
    "max_model_len": 256,
    "enable_lora": True,
    "max_lora_rank": 8,
    "kv_cache_memory_gib": 0.25,
}


def lora(adapters, name: str, lora_id: int) -> LoRARequest:
    return LoRARequest(name, lora_id, str(adapters[name][0]))


@pytest.fixture(scope="module")
def llm():
    return LLM(max_loras=2, **OPTIONS)


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_greedy_tokens_and_logits_equal_transformers_with_peft(
    llm, smollm2_adapters, smollm2_tokenizer
):
    _, peft_model = smollm2_adapters["alpha"]
    outs = llm.generate(PROMPTS, GREEDY, lora_request=lora(smollm2_adapters, "alpha", 1))
    for prompt, out in zip(PROMPTS, outs):
        ids = smollm2_tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = peft_model.generate(
                ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=2
            )
            logits = peft_model(ref).logits[0, ids.shape[1] - 1 : -1]
        completion = out.outputs[0]
        assert completion.token_ids == ref[0, ids.shape[1] :].tolist()
        ref_lp = logits.log_softmax(-1)[torch.arange(8), ref[0, ids.shape[1] :]]
        ours = [pos[t].logprob for t, pos in zip(completion.token_ids, completion.logprobs)]
        assert ours == pytest.approx(ref_lp.tolist(), abs=2e-4)


def test_a_mixed_batch_equals_each_request_alone(llm, smollm2_adapters):
    a, b = lora(smollm2_adapters, "alpha", 1), lora(smollm2_adapters, "beta", 2)
    mixed = llm.generate(PROMPTS * 2, GREEDY, lora_request=[None, a, b, b, None, a])
    alone = [
        llm.generate(p, GREEDY, lora_request=r)[0]
        for p, r in zip(PROMPTS * 2, [None, a, b, b, None, a])
    ]
    assert tokens(mixed) == tokens(alone)
    # The adapters really differ from each other and from the base model.
    assert len({tuple(t) for t in tokens(mixed[:3])}) == 3 or tokens(mixed)[1] != tokens(mixed)[4]


def test_the_prefix_cache_never_serves_one_adapters_kv_to_another(llm, smollm2_adapters):
    prompt = PROMPTS[2]  # several full blocks
    a, b = lora(smollm2_adapters, "alpha", 1), lora(smollm2_adapters, "beta", 2)
    scheduler = llm.engine.engine_core.scheduler
    expected_b = tokens(llm.generate(prompt, GREEDY, lora_request=b))
    assert scheduler.reset_prefix_cache()
    llm.generate(prompt, GREEDY, lora_request=a)
    hits_before = scheduler.make_stats().prefix_cache_hits
    assert tokens(llm.generate(prompt, GREEDY, lora_request=b)) == expected_b
    assert scheduler.make_stats().prefix_cache_hits == hits_before
    llm.generate(prompt, GREEDY, lora_request=b)  # the same adapter again does hit
    assert scheduler.make_stats().prefix_cache_hits > hits_before


def test_more_adapters_than_slots_all_finish_with_their_own_weights(smollm2_adapters):
    one_slot = LLM(max_loras=1, max_cpu_loras=2, **OPTIONS)
    requests = [lora(smollm2_adapters, name, i + 1) for i, name in enumerate(smollm2_adapters)]
    batch = one_slot.generate([PROMPTS[0]] * 6, GREEDY, lora_request=requests * 2)
    alone = [tokens(one_slot.generate(PROMPTS[0], GREEDY, lora_request=r))[0] for r in requests]
    assert tokens(batch) == alone * 2
    assert len({tuple(t) for t in alone}) == 3


def test_lora_enabled_but_unused_gives_the_base_models_outputs(llm, prompts, hf_greedy):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    assert tokens(llm.generate(prompts[:4], params)) == hf_greedy[:4]


def test_a_bad_adapter_raises_and_the_engine_serves_on(llm, tmp_path):
    with pytest.raises(AdapterError, match=r"no adapter_config\.json"):
        tmp_path.joinpath("empty").mkdir()
        llm.generate(
            PROMPTS[0], GREEDY, lora_request=LoRARequest("bad", 9, str(tmp_path / "empty"))
        )
    assert tokens(llm.generate(PROMPTS[0], GREEDY))[0]


def test_lora_requests_on_an_engine_without_lora_are_refused(smollm2_adapters):
    plain = LLM(
        "smollm2-135m",
        random_weights=True,
        dtype="float32",
        max_model_len=256,
        hf_overrides={"num_hidden_layers": 1, "vocab_size": 512},
    )
    with pytest.raises(ValueError, match="--enable-lora"):
        plain.generate([[1, 2, 3]], GREEDY, lora_request=lora(smollm2_adapters, "alpha", 1))
