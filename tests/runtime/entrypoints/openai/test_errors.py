"""Bad input, authentication and load shedding: the right status, OpenAI's
error shape naming the field, and a server that keeps serving afterwards."""

from __future__ import annotations

import asyncio

import httpx
import pytest

MODEL = "smollm2-135m-instruct"
KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server(start_server):
    # Two running at most and two waiting: a burst of ten must be shed.
    return start_server(
        ["--max-num-seqs", "2", "--max-waiting-requests", "2"], {"PAGODA_API_KEY": KEY}
    )


def post(server, path: str, body, headers=AUTH, **kw) -> httpx.Response:
    if isinstance(body, (bytes, str)):
        return httpx.post(
            server.url + path,
            content=body,
            headers={**headers, "content-type": "application/json"},
            **kw,
        )
    return httpx.post(server.url + path, json=body, headers=headers, **kw)


def assert_error(resp: httpx.Response, status: int, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param, error
    return error


def good_completion(server) -> None:
    resp = post(server, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "x", "prompt": ', None),  # malformed JSON
        ({"model": MODEL, "prompt": "Hi", "max_tokens": "lots"}, "max_tokens"),
        ({"model": MODEL, "prompt": "Hi", "temperature": [1]}, "temperature"),
        ({"model": MODEL, "prompt": "Hi", "max_tokens": -1}, "max_tokens"),
        ({"model": MODEL, "prompt": "Hi", "n": 0}, "n"),
        ({"model": MODEL, "prompt": "Hi", "top_p": 1.5}, "top_p"),
        ({"model": MODEL}, "prompt"),
        ({"model": MODEL, "prompt": [5] * 1100}, "prompt"),  # longer than max_model_len
        ({"model": MODEL, "prompt": [10**7]}, "prompt"),  # outside the vocabulary
    ],
)
def test_invalid_completion_is_a_400_naming_the_field(server, body, param):
    error = assert_error(post(server, "/v1/completions", body), 400, param)
    assert error["type"] == "BadRequestError"


def test_overlong_prompt_message_names_the_context_length(server):
    error = assert_error(post(server, "/v1/completions", {"prompt": [5] * 1100}), 400, "prompt")
    assert "maximum context length is 1024" in error["message"]


def test_invalid_chat_requests(server):
    msgs = [{"role": "user", "content": "Hi"}]
    assert_error(post(server, "/v1/chat/completions", {"messages": []}), 400, "messages")
    assert_error(
        post(server, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}),
        400,
    )
    assert_error(
        post(
            server,
            "/v1/chat/completions",
            {"messages": msgs, "response_format": {"type": "json_object"}},
        ),
        400,
        "response_format",
    )
    assert_error(
        post(server, "/v1/chat/completions", {"messages": msgs, "top_logprobs": 2}),
        400,
        "top_logprobs",
    )
    assert_error(
        post(server, "/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 0}),
        400,
        "max_completion_tokens",
    )
    good_completion(server)


def test_unknown_model_is_a_404(server):
    error = assert_error(
        post(server, "/v1/completions", {"model": "gpt-9", "prompt": "Hi"}), 404, "model"
    )
    assert "gpt-9" in error["message"]
    assert_error(httpx.get(server.url + "/v1/nothing-here", headers=AUTH), 404)


def test_wrong_or_missing_api_key_is_a_401_and_probes_stay_open(server):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    assert_error(
        post(server, "/v1/completions", body, headers={"Authorization": "Bearer nope"}), 401
    )
    assert_error(post(server, "/v1/completions", body, headers={}), 401)
    assert_error(httpx.get(server.url + "/v1/models"), 401)
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 200
    good_completion(server)


def test_the_official_client_sees_typed_errors(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=-3)
    assert bad.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="Hi")
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="bad", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


async def test_a_burst_beyond_max_waiting_requests_is_shed_with_retry_after(server):
    body = {"model": MODEL, "prompt": "Count: 1, 2,", "max_tokens": 24, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=120) as client:
        responses = await asyncio.gather(
            *(client.post("/v1/completions", json=body) for _ in range(10))
        )
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) >= 4, statuses  # 2 running + 2 waiting
    shed = [r for r in responses if r.status_code == 503]
    assert shed, statuses
    assert all(r.headers["retry-after"] == "1" for r in shed)
    assert_error(shed[0], 503)
    assert all(
        r.json()["usage"]["completion_tokens"] == 24 for r in responses if r.status_code == 200
    )
    good_completion(server)
