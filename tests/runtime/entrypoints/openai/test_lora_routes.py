"""Pagoda's `generation` field on vLLM's adapter routes: optional, an int64
from 0, raising the generation the pod remembers; any other value is the
server's usual 400 naming the field, and changes nothing.

In-process (the routes and error handlers on a FastAPI app, a LoRARegistry
whose engine core calls do nothing): no model needed. The routes on the
real server are tested in test_lora.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pagoda.runtime.engine.lora_registry import LoRARegistry
from pagoda.runtime.entrypoints.openai.errors import install_error_handlers
from pagoda.runtime.entrypoints.openai.lora_routes import install_lora_routes
from pagoda.runtime.entrypoints.openai.openapi import install_openapi
from pagoda.runtime.sampling_params import INT64_MAX

LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
SQL = "/adapters/sql"


async def nothing(method: str, **kwargs: Any) -> None:
    """The engine core's add_lora/remove_lora: accepted."""


@pytest.fixture
def registry() -> LoRARegistry:
    return LoRARegistry(nothing, "base")


@pytest.fixture
async def client(registry: LoRARegistry):
    app = FastAPI()
    install_error_handlers(app)
    install_openapi(app)
    install_lora_routes(app, SimpleNamespace(lora_registry=registry))  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://pod") as client:
        yield client


async def test_the_generation_is_accepted_and_remembered(
    client: httpx.AsyncClient, registry: LoRARegistry
) -> None:
    loaded = await client.post(LOAD, json={"lora_name": "sql", "lora_path": SQL, "generation": 7})
    assert loaded.status_code == 200, loaded.text
    assert loaded.json() == {"lora_name": "sql", "lora_path": SQL, "status": "loaded"}
    assert registry.generation == 7
    unloaded = await client.post(UNLOAD, json={"lora_name": "sql", "generation": 8})
    assert unloaded.status_code == 200, unloaded.text
    assert registry.generation == 8 and "sql" not in registry.adapters
    # An unload of an adapter already gone is still a 404, and still counts:
    # the file must not load it back for an older generation.
    gone = await client.post(UNLOAD, json={"lora_name": "sql", "generation": 9})
    assert gone.status_code == 404
    assert registry.generation == 9


@pytest.mark.parametrize("generation", [0, INT64_MAX])
async def test_the_bounds_are_int64s(
    client: httpx.AsyncClient, registry: LoRARegistry, generation: int
) -> None:
    body = {"lora_name": "sql", "lora_path": SQL, "generation": generation}
    assert (await client.post(LOAD, json=body)).status_code == 200
    assert registry.generation == generation


async def test_without_a_generation_as_in_vllm_nothing_is_ordered(
    client: httpx.AsyncClient, registry: LoRARegistry
) -> None:
    assert (await client.post(LOAD, json={"lora_name": "sql", "lora_path": SQL})).status_code == 200
    body = {"lora_name": "sql", "generation": None}  # null: the same as absent
    assert (await client.post(UNLOAD, json=body)).status_code == 200
    assert registry.generation is None


def assert_bad_generation(resp: httpx.Response) -> None:
    """The server's usual 400: OpenAI's error shape, naming the field."""
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["param"] == "generation"
    assert error["message"].startswith("generation: ")


@pytest.mark.parametrize(
    "generation", ["3", 3.0, 2.5, True, -1, INT64_MAX + 1, 2**64, [3], {"g": 3}]
)
@pytest.mark.parametrize("route", [LOAD, UNLOAD])
async def test_any_other_generation_is_a_400_that_changes_nothing(
    client: httpx.AsyncClient, registry: LoRARegistry, route: str, generation: Any
) -> None:
    await registry.load("fr", "/adapters/fr", generation=5)
    body = {"lora_name": "fr" if route == UNLOAD else "sql", "lora_path": SQL}
    assert_bad_generation(await client.post(route, json={**body, "generation": generation}))
    assert set(registry.adapters) == {"fr"} and registry.generation == 5


async def test_the_field_is_described_in_openapi_with_int64s_exact_bounds(
    client: httpx.AsyncClient,
) -> None:
    # (FastAPI's own generator would publish 2**63 as the maximum, a float.)
    schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
    for model in ("LoadLoRAAdapterRequest", "UnloadLoRAAdapterRequest"):
        field = schemas[model]["properties"]["generation"]
        (integer,) = [option for option in field["anyOf"] if option.get("type") == "integer"]
        assert (integer["minimum"], integer["maximum"]) == (0, INT64_MAX)
        assert "generation" not in schemas[model].get("required", [])
