"""Fuzzing every route described by /openapi.json against a live server: no
input, valid or not, may produce a 5xx, and every status and content type
answered must be one the description documents.

schemathesis generates the cases from the server's own description, with
generation capped small (max_tokens, n, prompt counts) and a context of 128
tokens, so a few hundred cases run in about a minute on two CPU cores.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    status_code_conformance,
)

pytestmark = [pytest.mark.model, pytest.mark.slow]

# Examples per route and mode: with the routes below, a few hundred cases.
MAX_EXAMPLES = 30
# What a generated request may ask of the engine, at most.
CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "n": 2, "min_tokens": 2, "logprobs": 2}
POST_ROUTES = [
    "/v1/completions",
    "/v1/chat/completions",
    "/tokenize",
    "/detokenize",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
]
GET_ROUTES = ["/health", "/version", "/metrics", "/v1/models"]


def cap_generation(spec: dict) -> dict:
    """The server's description, with the generation-heavy fields bounded so
    every case is quick: max_tokens required and small, few prompts/messages."""
    schemas = spec["components"]["schemas"]
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        model = schemas[name]
        model.setdefault("required", []).append("max_tokens")
        for field, top in CAPS.items():
            prop = model["properties"].get(field)
            if prop is None:
                continue
            for option in prop.get("anyOf", [prop]):
                if option.get("type") == "integer":
                    option["maximum"] = top
    for prop in (
        schemas["CompletionRequest"]["properties"]["prompt"],
        schemas["ChatCompletionRequest"]["properties"]["messages"],
    ):
        for option in prop.get("anyOf", [prop]):
            if option.get("type") == "array":
                option["maxItems"] = 2
    return spec


@pytest.fixture(scope="module")
def fuzz_server(start_server):
    # With LoRA on, so that the adapter routes meet the fuzzer with a registry
    # behind them (random names and paths: every load must be a clean 4xx).
    flags = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"]
    return start_server(["--max-model-len", "128", "--max-waiting-requests", "8", *flags])


@pytest.fixture(scope="module")
def spec(fuzz_server) -> dict:
    return httpx.get(fuzz_server.url + "/openapi.json", timeout=30).json()


@pytest.fixture(scope="module")
def fuzz_schema(spec):
    return schemathesis.openapi.from_dict(cap_generation(spec))


def test_every_described_route_is_fuzzed(spec):
    described = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    fuzzed = {("POST", p) for p in POST_ROUTES} | {("GET", p) for p in GET_ROUTES}
    assert described == fuzzed


def fuzz(operation, mode: GenerationMode, base_url: str, examples: int) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same cases every run: a failure reproduces
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:
        response = case.call(base_url=base_url, timeout=60)
        case.validate_response(
            response,
            checks=[not_a_server_error, status_code_conformance, content_type_conformance],
        )

    run()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", POST_ROUTES)
def test_no_request_body_gets_a_server_error(fuzz_schema, fuzz_server, path, mode):
    fuzz(fuzz_schema[path]["POST"], mode, fuzz_server.url, MAX_EXAMPLES)


@pytest.mark.parametrize("path", GET_ROUTES)
def test_the_get_routes_answer_as_described(fuzz_schema, fuzz_server, path):
    fuzz(fuzz_schema[path]["GET"], GenerationMode.POSITIVE, fuzz_server.url, 3)
