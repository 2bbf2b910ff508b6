"""/openapi.json that tells the truth: the statuses the server really answers,
each with OpenAI's error body, and no 422 (validation errors are folded into
400). Clients and fuzzers generated from the description then expect what
they get."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pagoda.runtime.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ErrorResponse,
    LoadLoRAAdapterRequest,
    TokenizeRequest,
    UnloadLoRAAdapterRequest,
)

REQUEST_MODELS = (
    CompletionRequest,
    ChatCompletionRequest,
    TokenizeRequest,
    DetokenizeRequest,
    # Their `generation` is an int64 too.
    LoadLoRAAdapterRequest,
    UnloadLoRAAdapterRequest,
)
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _error(description: str, headers: dict | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"model": ErrorResponse, "description": description}
    if headers:
        out["headers"] = headers
    return out


_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}

# Every route behind the middleware can answer these.
COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _error("missing or wrong API key (when the server has one)"),
    413: _error("the request body is larger than --max-request-body-bytes"),
    500: _error("unexpected server error"),
    503: _error(
        "overloaded (more than --max-waiting-requests waiting), draining, or the "
        "engine is not running",
        _RETRY_AFTER,
    ),
}
# Routes with a request body and a model name.
MODEL_ROUTE_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("invalid or unsupported field (`param` names it), or a prompt too long"),
    404: _error("unknown model"),
    **COMMON_ERRORS,
}


def install_openapi(app: FastAPI) -> None:
    """Replace FastAPI's generator with one that drops the 422 it adds."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, routes=app.routes, description=app.description
            )
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                components.pop(unused, None)
            for model in REQUEST_MODELS:
                if model.__name__ in components:
                    _restore_exact_bounds(components[model.__name__], model.model_json_schema())
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _restore_exact_bounds(generated: Any, exact: Any) -> None:
    """FastAPI's OpenAPI model stores bounds as floats, which turns int64's
    limits into 2**63 (out of range by one); put pydantic's integers back.
    Both trees come from the same pydantic schema, so they match in shape."""
    if isinstance(generated, dict) and isinstance(exact, dict):
        for key, value in generated.items():
            if key in _BOUNDS and isinstance(exact.get(key), int):
                generated[key] = exact[key]
            elif key in exact:
                _restore_exact_bounds(value, exact[key])
    elif isinstance(generated, list) and isinstance(exact, list):
        for g, e in zip(generated, exact):
            _restore_exact_bounds(g, e)
