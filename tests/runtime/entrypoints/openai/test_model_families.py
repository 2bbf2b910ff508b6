"""The server on a Llama 3.1 setup (its real chat template, BOS, three EOS ids
and generation config; tiny random weights): chat prompts carry one BOS,
/tokenize agrees with usage, every EOS stops, the model's sampling defaults
apply to fields a request leaves unset and are reported at start-up."""

import httpx
import pytest

MESSAGES = [{"role": "user", "content": "Name three primary colours."}]


@pytest.fixture(scope="module")
def llama_server(model_family, start_server, tmp_path_factory):
    folder, facts = model_family("llama-3.1")
    defaults = tmp_path_factory.mktemp("generation")
    # The family's own generation_config.json, with greedy as the default
    # temperature so its effect on unset fields is observable.
    text = (folder / "generation_config.json").read_text()
    (defaults / "generation_config.json").write_text(
        text.replace('"temperature": 0.6', '"temperature": 0.0')
    )
    server = start_server(
        [str(folder), "--max-model-len", "256", "--generation-config", str(defaults)]
    )
    return server, folder, facts


def post(server, path: str, body: dict) -> dict:
    resp = httpx.post(server.url + path, json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_chat_usage_equals_tokenize_and_has_one_bos(llama_server):
    server, folder, facts = llama_server
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    chat = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1})
    tokens = post(server, "/tokenize", {"messages": MESSAGES})
    assert tokens["tokens"] == list(expected)
    assert chat["usage"]["prompt_tokens"] == tokens["count"] == len(expected)
    assert tokens["tokens"].count(facts["bos_id"]) == 1


def test_add_special_tokens_in_a_chat_request_overrides_the_default(llama_server):
    server, _, facts = llama_server
    plain = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1})
    doubled = post(
        server,
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 1, "add_special_tokens": True},
    )
    assert doubled["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + 1
    tokens = post(server, "/tokenize", {"messages": MESSAGES, "add_special_tokens": True})
    assert tokens["tokens"][:2] == [facts["bos_id"], facts["bos_id"]]


def test_tokenize_of_a_prompt_counts_what_completions_bill(llama_server):
    server, _, facts = llama_server
    tokens = post(server, "/tokenize", {"prompt": "Hello there"})
    comp = post(server, "/v1/completions", {"prompt": "Hello there", "max_tokens": 1})
    assert tokens["tokens"][0] == facts["bos_id"]
    assert comp["usage"]["prompt_tokens"] == tokens["count"]


def test_every_eos_id_stops_a_chat_completion(llama_server):
    server, _, facts = llama_server
    for eos in sorted(facts["eos_ids"]):
        body = {"messages": MESSAGES, "max_tokens": 8, "logit_bias": {str(eos): 100}}
        out = post(server, "/v1/chat/completions", body)
        assert out["choices"][0]["finish_reason"] == "stop", eos
        assert out["usage"]["completion_tokens"] == 1
        assert out["choices"][0]["message"]["content"] == ""  # EOS is special: not text


def test_unset_sampling_fields_take_the_models_defaults(llama_server):
    server, _, _ = llama_server
    body = {"prompt": "Hello there", "max_tokens": 8}
    unset = post(server, "/v1/completions", body)["choices"][0]["text"]
    greedy = post(server, "/v1/completions", {**body, "temperature": 0})["choices"][0]["text"]
    hot = post(server, "/v1/completions", {**body, "temperature": 1.0, "seed": 3})
    assert unset == greedy
    assert hot["choices"][0]["text"] != greedy  # a field the request sets wins


def test_startup_log_reports_eos_ids_and_defaults(llama_server):
    server, _, facts = llama_server
    log = server.log_path.read_text()
    assert "Default sampling parameters from the model's generation config" in log
    assert "temperature=0.0" in log and "top_p=0.9" in log
    assert "End-of-sequence token ids" in log
    assert all(str(eos) in log for eos in facts["eos_ids"])
