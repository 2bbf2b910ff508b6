"""The admin listener in-process (no model): its own key, the routes it serves,
one server over two sockets that reaches each port's app and closes both.

The real server with --admin-port is tested in test_admin_port.py.
"""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, Response
from pagoda.runtime.engine.lora_registry import LoRARegistry
from pagoda.runtime.entrypoints.cli import build_parser
from pagoda.runtime.entrypoints.openai.admin import ByPort, build_admin_app, listen
from pagoda.runtime.entrypoints.openai.api_server import _Server
from pagoda.runtime.entrypoints.openai.cli_args import server_config_from
from pagoda.runtime.entrypoints.openai.lora_routes import adapter_cards
from pagoda.runtime.entrypoints.openai.middleware import ServerState
from pagoda.runtime.entrypoints.openai.protocol import ModelCard, ModelList

ADMIN_KEY = "operator-token"
LOAD = "/v1/load_lora_adapter"
BODY = {"lora_name": "sql", "lora_path": "/adapters/sql"}


async def nothing(method: str, **kwargs: Any) -> None:
    """The engine core's add_lora/remove_lora: accepted."""


def admin_app(state: ServerState | None = None, key: str | None = ADMIN_KEY) -> FastAPI:
    registry = LoRARegistry(nothing, "base")

    async def health() -> Response:
        return Response(status_code=200)

    async def metrics() -> Response:
        return PlainTextResponse("vllm:num_requests_waiting 0\n")

    async def models() -> dict:
        base = ModelCard(id="base", created=0, root="base", max_model_len=64)
        return ModelList(data=[base, *adapter_cards(registry, 64)]).model_dump()

    engine = SimpleNamespace(lora_registry=registry)
    return build_admin_app(
        engine,  # type: ignore[arg-type]
        state or ServerState(),
        key,
        health=health,
        metrics=metrics,
        models=models,
    )


@pytest.fixture
async def admin():
    transport = httpx.ASGITransport(app=admin_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://pod:8001") as client:
        yield client


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_KEY}],
    ids=["missing", "wrong", "not-bearer"],
)
async def test_the_control_routes_need_the_admin_key(admin: httpx.AsyncClient, headers) -> None:
    for response in (
        await admin.post(LOAD, json=BODY, headers=headers),
        await admin.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}, headers=headers),
        await admin.get("/v1/models", headers=headers),
    ):
        error = assert_openai_error(response, 401)
        assert error["message"] == "invalid or missing admin key"


async def test_with_the_admin_key_adapters_load_and_list(admin: httpx.AsyncClient) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    loaded = await admin.post(LOAD, json=BODY, headers=auth)
    assert loaded.status_code == 200, loaded.text
    listed = await admin.get("/v1/models", headers=auth)
    assert [m["id"] for m in listed.json()["data"]] == ["base", "sql"]


async def test_probes_and_scrapes_need_no_key(admin: httpx.AsyncClient) -> None:
    assert (await admin.get("/health")).status_code == 200
    assert "vllm:num_requests_waiting" in (await admin.get("/metrics")).text


async def test_the_admin_port_has_no_api_description_and_no_openai_routes(
    admin: httpx.AsyncClient,
) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert_openai_error(await admin.get("/openapi.json", headers=auth), 404)
    assert_openai_error(await admin.post("/v1/completions", json={}, headers=auth), 404)


async def test_draining_refuses_control_calls() -> None:
    state = ServerState()
    transport = httpx.ASGITransport(app=admin_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://pod:8001") as client:
        state.draining = True
        auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
        assert_openai_error(await client.post(LOAD, json=BODY, headers=auth), 503)


# -- one server, two sockets ------------------------------------------------------------


def app_saying(text: str) -> FastAPI:
    app = FastAPI()

    @app.get("/who")
    async def who() -> dict:
        return {"app": text}

    return app


def refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


async def test_each_port_reaches_its_app_and_shutdown_closes_both_sockets() -> None:
    public, admin = listen("127.0.0.1", 0), listen("127.0.0.1", 0)
    ports = [s.getsockname()[1] for s in (public, admin)]
    app = ByPort(app_saying("public"), {ports[1]: app_saying("admin")})
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
    server = _Server(config, ServerState(), drain_timeout=1)
    serving = asyncio.ensure_future(server.serve(sockets=[public, admin]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient() as client:
            said = [(await client.get(f"http://127.0.0.1:{p}/who")).json() for p in ports]
        assert said == [{"app": "public"}, {"app": "admin"}]
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
    assert public.fileno() == -1 and admin.fileno() == -1
    assert all(refused(p) for p in ports)
    # Nothing holds the ports: they can be bound again at once.
    for port in ports:
        listen("127.0.0.1", port).close()


def test_a_taken_port_is_an_error_naming_the_address() -> None:
    with listen("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        taken.listen()
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            listen("127.0.0.1", port)


# -- flags ------------------------------------------------------------------------------


def config_of(*flags: str):
    return server_config_from(build_parser().parse_args(["serve", "tiny", *flags]))[1]


def test_the_admin_port_is_off_unless_asked() -> None:
    config = config_of()
    assert config.admin_port is None and config.admin_key is None


def test_the_admin_key_comes_from_the_flag_or_its_env_twin(monkeypatch) -> None:
    assert config_of("--admin-port", "8001", "--admin-key", "k").admin_key == "k"
    monkeypatch.setenv("PAGODA_ADMIN_KEY", "from-env")
    config = config_of("--admin-port", "8001")
    assert (config.admin_port, config.admin_key) == (8001, "from-env")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--admin-port", "8000"], "--admin-port must differ from --port"),
        (["--admin-port", "70000"], "--admin-port must be in 1..65535"),
        (["--admin-key", "k"], "--admin-key needs --admin-port"),
    ],
)
def test_bad_admin_flags_are_refused(flags, message) -> None:
    with pytest.raises(ValueError, match=message):
        config_of(*flags)
