"""Tokenization, EOS and generation defaults on Llama 3.1, Mistral and Qwen2.5
setups (real chat templates, special tokens, EOS lists and generation
configs; tiny random weights): what SmolLM2 alone cannot show."""

import pytest
from pagoda.runtime.entrypoints.llm import LLM
from pagoda.runtime.sampling_params import SamplingParams

FAMILIES = ["llama-3.1", "mistral", "qwen2.5"]
MESSAGES = [
    {"role": "user", "content": "Name three primary colours."},
    {"role": "assistant", "content": "Red, yellow and blue."},
    {"role": "user", "content": "And secondary?"},
]
OPTIONS = {"dtype": "float32", "max_model_len": 256, "num_kv_blocks": 64}


@pytest.fixture(scope="module")
def family_llm(model_family):
    """family name -> (LLM, facts); one engine per family for the module."""
    engines = {}

    def get(name: str):
        if name not in engines:
            folder, facts = model_family(name)
            engines[name] = (LLM(str(folder), **OPTIONS), facts)
        return engines[name]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_prompt_has_exactly_the_templates_bos(family_llm, family):
    llm, facts = family_llm(family)
    out = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=1))[0]
    ids = out.prompt_token_ids
    # transformers' own chat tokenization (template, then no special tokens).
    expected = llm.get_tokenizer().apply_chat_template(
        MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert ids == list(expected)
    if facts["bos_id"] is None:
        assert ids[0] != facts["tokenizer_eos_id"]
    else:
        assert ids[0] == facts["bos_id"]
        assert ids.count(facts["bos_id"]) == 1


@pytest.mark.parametrize("family", ["llama-3.1", "mistral"])
def test_plain_prompts_still_get_the_tokenizers_bos(family_llm, family):
    llm, facts = family_llm(family)
    out = llm.generate("Hello there", SamplingParams(temperature=0, max_tokens=1))[0]
    assert out.prompt_token_ids[0] == facts["bos_id"]
    assert out.prompt_token_ids.count(facts["bos_id"]) == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_every_listed_eos_id_stops_generation(family_llm, family):
    llm, facts = family_llm(family)
    assert set(llm.engine.processor.eos_token_ids) == facts["eos_ids"]
    for eos in sorted(facts["eos_ids"]):
        # A bias of 100 makes the model emit this EOS id first, whatever the weights.
        params = SamplingParams(temperature=0, max_tokens=8, logit_bias={eos: 100.0})
        out = llm.generate("Hello there", params)[0].outputs[0]
        assert out.token_ids == [eos], f"EOS {eos} did not stop {family}"
        assert out.finish_reason == "stop"
        assert out.stop_reason is None  # an EOS, not a stop_token_ids entry


@pytest.mark.parametrize("family", FAMILIES)
def test_min_tokens_masks_every_eos_id(family_llm, family):
    llm, facts = family_llm(family)
    bias = {eos: 100.0 for eos in facts["eos_ids"]}
    params = SamplingParams(temperature=0, max_tokens=6, min_tokens=4, logit_bias=bias)
    out = llm.generate("Hello there", params)[0].outputs[0]
    assert len(out.token_ids) == 5
    assert not set(out.token_ids[:4]) & facts["eos_ids"]
    assert out.token_ids[4] in facts["eos_ids"] and out.finish_reason == "stop"


@pytest.mark.parametrize("family", FAMILIES)
def test_ignore_eos_ignores_every_eos_id(family_llm, family):
    llm, facts = family_llm(family)
    bias = {eos: 100.0 for eos in facts["eos_ids"]}
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logit_bias=bias)
    out = llm.generate("Hello there", params)[0].outputs[0]
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_config_defaults_are_the_default_params(family_llm, family):
    llm, facts = family_llm(family)
    defaults = llm.get_default_sampling_params()
    expected = SamplingParams(**facts["sampling_defaults"])
    assert defaults == expected


def test_generation_defaults_apply_when_no_params_are_given(model_family, tmp_path):
    folder, _ = model_family("llama-3.1")
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.0, "max_new_tokens": 5}')
    llm = LLM(str(folder), generation_config=str(tmp_path), **OPTIONS)
    unset = llm.generate("Hello there")[0].outputs[0]
    greedy = llm.generate("Hello there", SamplingParams(temperature=0, max_tokens=5))[0].outputs[0]
    assert len(unset.token_ids) == 5
    assert unset.token_ids == greedy.token_ids


def test_generation_config_none_keeps_only_config_and_tokenizer_eos(model_family):
    folder, facts = model_family("qwen2.5")
    llm = LLM(str(folder), generation_config="none", **OPTIONS)
    assert llm.get_default_sampling_params() == SamplingParams()
    expected = {facts["tokenizer_eos_id"], *facts["config_eos_ids"]}
    assert set(llm.engine.processor.eos_token_ids) == expected
