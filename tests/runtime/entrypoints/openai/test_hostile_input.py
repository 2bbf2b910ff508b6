"""Requests an attacker or a careless client sends: each gets a clean 4xx in
OpenAI's shape naming the field (never a 500), and the server serves on.
Also: fields that would change the output and are not implemented are
refused, the routes that spend CPU need the API key, and /openapi.json
documents what the server really answers."""

from __future__ import annotations

import json

import httpx
import pytest
from pagoda.runtime.sampling_params import (
    INT64_MAX,
    INT64_MIN,
    MAX_COUNT,
    MAX_LOGPROBS,
    MAX_N,
    MAX_TOKEN_ID,
)

MODEL = "smollm2-135m-instruct"
KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}
MSGS = [{"role": "user", "content": "Hi"}]
BODY_LIMIT = 100_000
HUGE = 2**70

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(
        ["--max-waiting-requests", "2", "--max-request-body-bytes", str(BODY_LIMIT)],
        {"PAGODA_API_KEY": KEY},
    )


def post(server, path: str, body, headers=AUTH, **kw) -> httpx.Response:
    # json.dumps escapes non-ASCII (lone surrogates included) as \uXXXX, as
    # a JSON client may; httpx's own encoder would refuse to send them.
    return httpx.post(
        server.url + path,
        content=json.dumps(body).encode(),
        headers={**headers, "content-type": "application/json"},
        timeout=60,
        **kw,
    )


def assert_error(resp: httpx.Response, status: int, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param, error
    return error


def assert_serving(server) -> None:
    resp = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert resp.status_code == 200, resp.text


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "Hi", "max_tokens": 2, **fields}


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": MSGS, "max_tokens": 2, **fields}


# -- 7: fields that change the output and are not implemented ---------------------------


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", completion(guided_json={"type": "object"}), "guided_json"),
        ("/v1/completions", completion(guided_regex="[a-z]+"), "guided_regex"),
        ("/v1/completions", completion(guided_choice=["yes", "no"]), "guided_choice"),
        ("/v1/completions", completion(guided_grammar="root ::= 'a'"), "guided_grammar"),
        ("/v1/completions", completion(structured_outputs={"json": {}}), "structured_outputs"),
        ("/v1/completions", completion(prompt_logprobs=1), "prompt_logprobs"),
        ("/v1/completions", completion(use_beam_search=True), "use_beam_search"),
        ("/v1/completions", completion(allowed_token_ids=[1, 2]), "allowed_token_ids"),
        ("/v1/completions", completion(bad_words=["no"]), "bad_words"),
        (
            "/v1/completions",
            completion(response_format={"type": "json_object"}),
            "response_format",
        ),
        ("/v1/chat/completions", chat(guided_json={"type": "object"}), "guided_json"),
        (
            "/v1/chat/completions",
            chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            chat(response_format={"type": "json_object"}),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            chat(tools=[{"type": "function", "function": {"name": "f"}}]),
            "tools",
        ),
        ("/v1/chat/completions", chat(tool_choice="required"), "tool_choice"),
        ("/v1/chat/completions", chat(functions=[{"name": "f"}]), "functions"),
        ("/v1/chat/completions", chat(function_call={"name": "f"}), "function_call"),
        ("/v1/chat/completions", chat(prompt_logprobs=2), "prompt_logprobs"),
        ("/v1/chat/completions", chat(chat_template="{{ 'x' }}"), "chat_template"),
        (
            "/v1/chat/completions",
            chat(stream=True, stream_options={"continuous_usage_stats": True}),
            "stream_options.continuous_usage_stats",
        ),
        (
            "/v1/chat/completions",
            chat(
                messages=[
                    {"role": "assistant", "tool_calls": [{"id": "1", "type": "function"}]},
                    *MSGS,
                ]
            ),
            "messages.0.tool_calls",
        ),
    ],
)
def test_an_unimplemented_field_that_changes_the_output_is_a_400_naming_it(
    server, path, body, param
):
    error = assert_error(post(server, path, body), 400, param)
    assert "not supported" in error["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", completion(user="u1", metadata={"a": "b"}, store=False)),
        ("/v1/completions", completion(service_tier="auto", guided_json=None, best_of=None)),
        ("/v1/completions", completion(response_format={"type": "text"})),
        ("/v1/chat/completions", chat(user="u1", metadata={"k": "v"}, store=True)),
        ("/v1/chat/completions", chat(tool_choice="none", tools=[], parallel_tool_calls=False)),
        ("/v1/chat/completions", chat(response_format={"type": "text"}, service_tier="auto")),
        ("/v1/chat/completions", chat(stream_options=None, functions=None)),
    ],
)
def test_harmless_unknown_or_switched_off_fields_are_accepted(server, path, body):
    resp = post(server, path, body)
    assert resp.status_code == 200, resp.text


def test_logit_bias_still_steers_the_output(server):
    greedy = post(server, "/v1/completions", completion(temperature=0, max_tokens=1, logprobs=0))
    assert greedy.status_code == 200, greedy.text
    token = greedy.json()["choices"][0]["logprobs"]["tokens"][0]
    ids = post(server, "/tokenize", {"prompt": token, "add_special_tokens": False}).json()
    banned = post(
        server,
        "/v1/completions",
        completion(temperature=0, max_tokens=1, logit_bias={str(ids["tokens"][0]): -100}),
    )
    assert banned.status_code == 200, banned.text
    assert banned.json()["choices"][0]["text"] != greedy.json()["choices"][0]["text"]


# -- 10: integers beyond 64 bits, and every integer field's range ----------------------


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", completion(seed=HUGE), "seed"),
        ("/v1/completions", completion(seed=-HUGE), "seed"),
        ("/v1/completions", completion(max_tokens=HUGE), "max_tokens"),
        ("/v1/completions", completion(top_k=HUGE), "top_k"),
        ("/v1/completions", completion(min_tokens=HUGE), "min_tokens"),
        ("/v1/completions", completion(n=HUGE), "n"),
        ("/v1/completions", completion(stop_token_ids=[1, HUGE]), "stop_token_ids"),
        ("/v1/completions", completion(logprobs=HUGE), "logprobs"),
        ("/v1/completions", completion(logit_bias={str(HUGE): 1}), "logit_bias"),
        ("/v1/completions", completion(prompt=[1, HUGE]), "prompt"),
        ("/v1/completions", completion(prompt=[[1], [HUGE]]), "prompt"),
        ("/v1/chat/completions", chat(max_completion_tokens=HUGE), "max_completion_tokens"),
        ("/v1/chat/completions", chat(logprobs=True, top_logprobs=HUGE), "top_logprobs"),
        ("/v1/chat/completions", chat(seed=HUGE), "seed"),
        ("/detokenize", {"tokens": [1, HUGE]}, "tokens"),
    ],
)
def test_an_integer_beyond_its_range_is_a_400_naming_the_field(server, path, body, param):
    assert_error(post(server, path, body), 400, param)


def test_the_extreme_seeds_of_int64_work_with_n_above_one(server):
    for seed in (INT64_MAX, INT64_MIN):
        resp = post(server, "/v1/completions", completion(n=2, seed=seed, temperature=1))
        assert resp.status_code == 200, resp.text
        assert len(resp.json()["choices"]) == 2


# -- 11: text that is not valid Unicode ------------------------------------------------------

SURROGATE = "\ud800"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", completion(prompt=f"Hi {SURROGATE}"), "prompt"),
        ("/v1/completions", completion(prompt=["ok", SURROGATE]), "prompt.1"),
        ("/v1/completions", completion(stop=[SURROGATE]), "stop.0"),
        ("/v1/completions", completion(stop=SURROGATE), "stop"),
        ("/v1/completions", completion(cache_salt=SURROGATE), "cache_salt"),
        ("/v1/completions", completion(model=SURROGATE), "model"),
        (
            "/v1/chat/completions",
            chat(messages=[{"role": "user", "content": SURROGATE}]),
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            chat(messages=[{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]),
            "messages.0.content.0.text",
        ),
        ("/v1/chat/completions", chat(stop=[SURROGATE]), "stop.0"),
        (
            "/v1/chat/completions",
            chat(chat_template_kwargs={"x": SURROGATE}),
            "chat_template_kwargs.x",
        ),
        ("/tokenize", {"prompt": SURROGATE}, "prompt"),
        ("/tokenize", {"messages": [{"role": "user", "content": SURROGATE}]}, "messages.0.content"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(server, path, body, param):
    error = assert_error(post(server, path, body), 400, param)
    assert "Unicode" in error["message"]
    assert_serving(server)


# -- 13: requests that can never fit ----------------------------------------------------------


def test_n_above_max_waiting_requests_is_a_permanent_400(server):
    error = assert_error(post(server, "/v1/completions", completion(n=3)), 400, "n")
    assert "--max-waiting-requests" in error["message"]
    # Two prompts of n=2 are four sequences: above the limit of 2 as well.
    assert_error(post(server, "/v1/completions", completion(prompt=["a", "b"], n=2)), 400, "n")


# -- 15: head-of-line blocking: prompt length and body size --------------------------------------


def test_a_prompt_longer_than_any_context_is_refused_by_its_length(server):
    # Under the body limit, yet more characters than 1024 tokens can hold.
    prompt = "#" * (BODY_LIMIT - 1000)
    error = assert_error(post(server, "/v1/completions", completion(prompt=prompt)), 400, "prompt")
    assert "characters" in error["message"]
    error = assert_error(post(server, "/tokenize", {"prompt": prompt}), 400, "prompt")
    assert "characters" in error["message"]


def test_a_body_above_the_limit_is_a_413(server):
    body = completion(prompt="x" * (BODY_LIMIT + 10))
    error = assert_error(post(server, "/v1/completions", body), 413)
    assert "--max-request-body-bytes" in error["message"]
    assert_serving(server)


def test_a_chunked_body_above_the_limit_is_a_413(server):
    def chunks():  # no Content-Length: the size is known only while reading
        yield b'{"prompt": "'
        for _ in range(12):
            yield b"x" * 10_000
        yield b'", "max_tokens": 2}'

    resp = httpx.post(
        server.url + "/v1/completions",
        content=chunks(),
        headers={**AUTH, "content-type": "application/json"},
        timeout=60,
    )
    assert "content-length" not in {k.lower() for k in resp.request.headers}
    assert_error(resp, 413)
    assert_serving(server)


# -- 16: the API key on every route that spends CPU ---------------------------------------------


def test_tokenize_and_detokenize_need_the_api_key(server):
    assert_error(post(server, "/tokenize", {"prompt": "Hi"}, headers={}), 401)
    assert_error(post(server, "/detokenize", {"tokens": [1, 2]}, headers={}), 401)
    bad = {"Authorization": "Bearer nope"}
    assert_error(post(server, "/tokenize", {"prompt": "Hi"}, headers=bad), 401)
    assert post(server, "/tokenize", {"prompt": "Hi"}).status_code == 200
    assert post(server, "/detokenize", {"tokens": [1, 2]}).status_code == 200


def test_probes_scrapes_and_the_api_description_stay_open(server):
    for path in ("/health", "/metrics", "/version", "/openapi.json"):
        assert httpx.get(server.url + path, timeout=30).status_code == 200, path


# -- 4: rejections and pending requests are counted ------------------------------------------


def test_rejections_are_counted_by_reason_and_pending_is_exported(server):
    def rejected(reason: str) -> float:
        key = f'pagoda:requests_rejected_total{{model_name="{MODEL}",reason="{reason}"}}'
        return server.metrics().get(key, 0.0)

    before = {r: rejected(r) for r in ("unauthorized", "invalid_request", "body_too_large")}
    post(server, "/v1/completions", completion(), headers={})
    post(server, "/v1/completions", completion(n=0))
    post(server, "/v1/completions", completion(prompt="x" * (BODY_LIMIT + 10)))
    assert rejected("unauthorized") == before["unauthorized"] + 1
    assert rejected("invalid_request") == before["invalid_request"] + 1
    assert rejected("body_too_large") == before["body_too_large"] + 1
    assert server.metrics()[f'pagoda:num_requests_pending{{model_name="{MODEL}"}}'] == 0


# -- 17: /openapi.json tells the truth ----------------------------------------------------------------


def test_openapi_documents_the_real_error_statuses_and_no_422(server):
    spec = httpx.get(server.url + "/openapi.json", timeout=30).json()
    error_ref = "#/components/schemas/ErrorResponse"
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        responses = spec["paths"][path]["post"]["responses"]
        assert "422" not in responses, path
        for status in ("200", "400", "401", "404", "413", "500", "503"):
            assert status in responses, (path, status)
        for status in ("400", "401", "404", "413", "500", "503"):
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema["$ref"] == error_ref, (path, status)
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_openapi_documents_the_value_ranges(server):
    schemas = httpx.get(server.url + "/openapi.json", timeout=30).json()["components"]["schemas"]

    def bounds(model: str, field: str) -> tuple:
        prop = schemas[model]["properties"][field]
        for option in prop.get("anyOf", [prop]):
            if "maximum" in option or "exclusiveMaximum" in option:
                return option.get("minimum"), option.get("maximum")
        raise AssertionError(f"{model}.{field} has no range: {prop}")

    assert bounds("CompletionRequest", "max_tokens") == (1, MAX_COUNT)
    assert bounds("CompletionRequest", "n") == (1, MAX_N)
    assert bounds("CompletionRequest", "seed") == (INT64_MIN, INT64_MAX)
    assert bounds("CompletionRequest", "logprobs") == (0, MAX_LOGPROBS)
    assert bounds("ChatCompletionRequest", "top_logprobs") == (0, MAX_LOGPROBS)
    assert bounds("ChatCompletionRequest", "max_completion_tokens") == (1, MAX_COUNT)
    assert bounds("ChatCompletionRequest", "top_p") == (None, 1)
    stop_ids = schemas["CompletionRequest"]["properties"]["stop_token_ids"]["anyOf"][0]
    assert stop_ids["items"]["maximum"] == MAX_TOKEN_ID
    assert schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] == MAX_TOKEN_ID
