"""`pagoda serve --admin-port` on the real SmolLM2: the adapter routes leave
the public port for the admin port, each port takes only its own key, and
SIGTERM closes both listeners."""

from __future__ import annotations

import signal
import socket

import httpx
import pytest

from .conftest import free_port

pytestmark = pytest.mark.model

MODEL = "smollm2"
USER_KEY, ADMIN_KEY = "user-key", "admin-key"
USER = {"Authorization": f"Bearer {USER_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
LORA_FLAGS = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"]


@pytest.fixture(scope="module")
def server(start_server):
    server = start_server(
        ["--served-model-name", MODEL, *LORA_FLAGS, "--admin-port", str(free_port())],
        {"PAGODA_API_KEY": USER_KEY, "PAGODA_ADMIN_KEY": ADMIN_KEY},
    )
    server.admin_url = f"http://127.0.0.1:{server.args[server.args.index('--admin-port') + 1]}"
    return server


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error


def model_ids(url: str, headers: dict) -> list[str]:
    response = httpx.get(url + "/v1/models", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return [m["id"] for m in response.json()["data"]]


def test_the_public_port_does_not_serve_the_adapter_routes(server, smollm2_adapters):
    folder = str(smollm2_adapters["alpha"][0])
    for path, body in (
        ("/v1/load_lora_adapter", {"lora_name": "alpha", "lora_path": folder}),
        ("/v1/unload_lora_adapter", {"lora_name": "alpha"}),
    ):
        assert_openai_error(httpx.post(server.url + path, json=body, headers=USER), 404)


def test_adapters_loaded_on_the_admin_port_are_served_on_the_public_port(server, smollm2_adapters):
    folder = str(smollm2_adapters["alpha"][0])
    body = {"lora_name": "alpha", "lora_path": folder}
    loaded = httpx.post(server.admin_url + "/v1/load_lora_adapter", json=body, headers=ADMIN)
    assert loaded.status_code == 200, loaded.text
    assert model_ids(server.admin_url, ADMIN) == [MODEL, "alpha"]
    assert model_ids(server.url, USER) == [MODEL, "alpha"]
    completion = {"model": "alpha", "prompt": "Hi", "max_tokens": 2}
    served = httpx.post(server.url + "/v1/completions", json=completion, headers=USER, timeout=60)
    assert served.status_code == 200, served.text
    unload = {"lora_name": "alpha"}
    gone = httpx.post(server.admin_url + "/v1/unload_lora_adapter", json=unload, headers=ADMIN)
    assert gone.status_code == 200, gone.text
    assert model_ids(server.url, USER) == [MODEL]


def test_each_port_takes_only_its_own_key(server):
    for url, wrong in ((server.admin_url, USER), (server.url, ADMIN)):
        assert_openai_error(httpx.get(url + "/v1/models", headers=wrong), 401)
        assert_openai_error(httpx.get(url + "/v1/models"), 401)
    error = assert_openai_error(httpx.get(server.admin_url + "/v1/models", headers=USER), 401)
    assert error["message"] == "invalid or missing admin key"


def test_probes_and_metrics_answer_on_both_ports(server):
    for url in (server.url, server.admin_url):
        assert httpx.get(url + "/health").status_code == 200
        assert "vllm:num_requests_waiting" in httpx.get(url + "/metrics").text


def test_sigterm_closes_both_listeners(server):
    ports = [int(u.rsplit(":", 1)[1]) for u in (server.url, server.admin_url)]
    assert server.stop(signal.SIGTERM) == 0, server.log()
    server.assert_clean()
    for port in ports:
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0
