"""LoRA adapters over HTTP on the real SmolLM2: load, list, select by model
name, replace and unload while requests run (none fails, none gets the wrong
weights), more adapters than slots, bad folders, the adapters file, metrics."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from pagoda.runtime import LoRARequest, SamplingParams

pytestmark = pytest.mark.model

MODEL = "smollm2"
PROMPT = "The capital of France is"
LORA_FLAGS = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "1", "--max-cpu-loras", "2"]


@pytest.fixture(scope="module")
def expected(smollm2_adapters):
    """Greedy 16-token completions of PROMPT by the offline engine: base and each adapter."""
    from pagoda.runtime import LLM

    llm = LLM(dtype="float32", max_model_len=256, enable_lora=True, max_lora_rank=8, max_loras=1)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    out = {"base": llm.generate(PROMPT, params)[0].outputs[0].text}
    for i, (name, (folder, _)) in enumerate(smollm2_adapters.items(), 1):
        lora = LoRARequest(name, i, str(folder))
        out[name] = llm.generate(PROMPT, params, lora_request=lora)[0].outputs[0].text
    assert len(set(out.values())) == len(out)  # every adapter changes the output
    return out


@pytest.fixture(scope="module")
def adapters_file(tmp_path_factory, smollm2_adapters):
    path = tmp_path_factory.mktemp("lora-file") / "adapters.json"
    path.write_text(json.dumps([{"name": "file-a", "path": str(smollm2_adapters["alpha"][0])}]))
    return path


@pytest.fixture(scope="module")
def server(start_server, adapters_file):
    return start_server(
        [
            "--served-model-name",
            MODEL,
            *LORA_FLAGS,
            "--lora-adapters-file",
            str(adapters_file),
            "--lora-adapters-poll-interval",
            "0.5",
        ]
    )


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def completion(model: str) -> dict:
    """A greedy 16-token completion of PROMPT by `model` (base or adapter)."""
    return {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
    }


def complete(server, model: str) -> httpx.Response:
    body = completion(model)
    return post(server, "/v1/completions", body)


def models(server) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]}


def test_the_adapters_file_is_served_from_the_first_ready(server, expected):
    listed = models(server)
    assert listed["file-a"]["parent"] == MODEL
    out = complete(server, "file-a").json()
    assert out["choices"][0]["text"] == expected["alpha"]
    assert out["model"] == "file-a"


def test_load_list_select_and_unload(server, smollm2_adapters, expected):
    path = str(smollm2_adapters["beta"][0])
    resp = post(server, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": path})
    assert resp.status_code == 200, resp.text
    # Loading the same folder again is a no-op, not an error.
    assert (
        post(server, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": path}).status_code
        == 200
    )
    listed = models(server)
    assert listed["b"] == {**listed["b"], "parent": MODEL, "root": path}
    assert listed["b"]["created"] >= listed[MODEL]["created"]
    # `created` is when the model came up, not when it was listed: a listing
    # in the next second is the same (clients diff and cache this list).
    time.sleep(1.05)
    assert models(server) == listed
    assert complete(server, "b").json()["choices"][0]["text"] == expected["beta"]
    assert complete(server, MODEL).json()["choices"][0]["text"] == expected["base"]
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "b"}).status_code == 200
    gone = complete(server, "b")
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "model"
    again = post(server, "/v1/unload_lora_adapter", {"lora_name": "b"})
    assert again.status_code == 404
    assert "b" not in models(server)


def test_another_folder_under_a_taken_name_is_a_409_unless_replace(
    server, smollm2_adapters, expected
):
    alpha, gamma = (str(smollm2_adapters[n][0]) for n in ("alpha", "gamma"))
    assert (
        post(server, "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": alpha}).status_code
        == 200
    )
    conflict = post(server, "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": gamma})
    assert conflict.status_code == 409
    assert conflict.json()["error"]["type"] == "ConflictError"
    assert complete(server, "c").json()["choices"][0]["text"] == expected["alpha"]
    replaced = post(
        server, "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": gamma, "replace": True}
    )
    assert replaced.status_code == 200
    assert complete(server, "c").json()["choices"][0]["text"] == expected["gamma"]
    post(server, "/v1/unload_lora_adapter", {"lora_name": "c"})


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"lora_name": "x", "lora_path": "/nonexistent/adapter"}, 400, "not a folder"),
        ({"lora_name": "x", "lora_path": "hf://nobody/nothing"}, 400, "not in the local"),
        ({"lora_name": MODEL, "lora_path": "/tmp"}, 400, "base model"),
        ({"lora_name": "bad name!", "lora_path": "/tmp"}, 400, "lora_name"),
        ({"lora_name": "x"}, 400, "lora_path"),
    ],
)
def test_bad_adapters_get_a_clear_error_and_the_server_serves_on(
    server, tmp_path, body, status, message
):
    resp = post(server, "/v1/load_lora_adapter", body)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]["message"] + str(resp.json()["error"]["param"])
    assert "x" not in models(server)
    assert complete(server, MODEL).status_code == 200


def test_an_empty_folder_is_refused_naming_the_missing_config(server, tmp_path):
    resp = post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)})
    assert resp.status_code == 400
    assert "adapter_config.json" in resp.json()["error"]["message"]


async def test_replace_and_unload_under_load_fail_nothing_and_mix_no_weights(
    server, smollm2_adapters, expected
):
    alpha, beta = (str(smollm2_adapters[n][0]) for n in ("alpha", "beta"))
    assert (
        post(server, "/v1/load_lora_adapter", {"lora_name": "live", "lora_path": alpha}).status_code
        == 200
    )
    body = completion("live")
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:

        async def one() -> str:
            resp = await client.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            return resp.json()["choices"][0]["text"]

        first = [asyncio.ensure_future(one()) for _ in range(6)]
        await asyncio.sleep(0.3)
        swap = await client.post(
            "/v1/load_lora_adapter", json={"lora_name": "live", "lora_path": beta, "replace": True}
        )
        assert swap.status_code == 200
        second = [asyncio.ensure_future(one()) for _ in range(6)]
        await asyncio.sleep(0.3)
        unload = await client.post("/v1/unload_lora_adapter", json={"lora_name": "live"})
        assert unload.status_code == 200
        texts = await asyncio.gather(*first, *second)
    # Each request ran wholly on one adapter's weights: alpha's before the
    # swap, beta's after it; nothing in between.
    assert set(texts[:6]) <= {expected["alpha"], expected["beta"]}
    assert set(texts[6:]) == {expected["beta"]}
    assert complete(server, "live").status_code == 404


async def test_more_adapters_than_slots_all_finish_with_their_own_weights(
    server, smollm2_adapters, expected
):
    names = list(smollm2_adapters)
    for name in names:
        path = str(smollm2_adapters[name][0])
        assert (
            post(
                server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}
            ).status_code
            == 200
        )
    async with httpx.AsyncClient(base_url=server.url, timeout=180) as client:

        async def one(model: str) -> str:
            resp = await client.post("/v1/completions", json=completion(model))
            assert resp.status_code == 200, resp.text
            return resp.json()["choices"][0]["text"]

        order = names * 2  # --max-loras 1: one adapter per step
        texts = await asyncio.gather(*(one(m) for m in order))
    assert texts == [expected[m] for m in order]
    for name in names:
        post(server, "/v1/unload_lora_adapter", {"lora_name": name})


def test_lora_metrics(server):
    text = httpx.get(server.url + "/metrics", timeout=30).text
    assert 'vllm:lora_requests_info{max_lora="1"' in text
    assert f'pagoda:lora_adapters_loaded{{model_name="{MODEL}"}}' in text
    assert 'pagoda:lora_adapter_loads_total{model_name="smollm2",outcome="ok"}' in text
    assert 'outcome="error"' in text  # the bad folders above


def test_the_adapters_file_converges_on_change(server, adapters_file, smollm2_adapters):
    beta = str(smollm2_adapters["beta"][0])
    adapters_file.write_text(json.dumps([{"name": "file-b", "path": beta}]))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        listed = models(server)
        if "file-b" in listed and "file-a" not in listed:
            break
        time.sleep(0.2)
    assert "file-b" in listed and "file-a" not in listed
    adapters_file.write_text("not json")  # a broken file changes nothing
    time.sleep(1.5)
    assert "file-b" in models(server)
