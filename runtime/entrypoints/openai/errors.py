"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}.

Types and codes follow vLLM (`BadRequestError`/400, ...), so clients that
branch on them work unchanged. FastAPI's 422 validation errors are folded
into 400 with the offending field as `param`, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pagoda.runtime.engine.async_llm import EngineOverloadedError
from pagoda.runtime.engine.core_client import EngineDeadError
from pagoda.runtime.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
from pagoda.runtime.sampling_params import InvalidRequestError
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """An error with an HTTP status, raised anywhere in a route."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.param = param
        self.headers = headers


def error_body(message: str, status: int, param: str | None = None) -> dict:
    """The JSON body of an error (also sent as an SSE event mid-stream)."""
    kind = _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    info = ErrorInfo(message=message, type=kind, param=param, code=status)
    return ErrorResponse(error=info).model_dump()


def error_response(
    message: str, status: int, param: str | None = None, headers: dict | None = None
) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status, headers=headers)


def _validation_param(loc: tuple) -> str | None:
    # ("body", "messages", 0, "content") -> "messages.0.content"; the body
    # itself (malformed JSON) has no field to name.
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('msg')}", None
    loc = tuple(first.get("loc", ()))
    ctx = first.get("ctx") or {}
    if "param" in ctx:
        # Screening errors (request_screen.py) name their field themselves.
        param = ".".join([p for p in (_validation_param(loc), ctx["param"]) if p])
        return str(first.get("msg")), param
    # A union field reports one error per alternative; the field is what matters.
    param = _validation_param(loc[:2] if len(loc) > 1 else loc)
    return f"{param or 'body'}: {first.get('msg')}", param


# Why a request was refused, for `pagoda:requests_rejected_total{reason}`.
_REASONS = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    500: "internal_error",
}


def rejection_reason(status: int) -> str:
    return _REASONS.get(status, f"http_{status}")


def install_error_handlers(app: FastAPI, on_rejected: Callable[[str], None] | None = None) -> None:
    """Every error leaves the server in the OpenAI shape; `on_rejected(reason)`
    counts each. Unexpected exceptions are the middleware's (a 500 that keeps
    the connection), not Starlette's, which re-raises them to uvicorn."""
    count = on_rejected or (lambda reason: None)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        count(rejection_reason(exc.status))
        return error_response(str(exc), exc.status, exc.param, exc.headers)

    @app.exception_handler(InvalidRequestError)
    async def _invalid(request: Request, exc: InvalidRequestError):
        count("invalid_request")
        return error_response(str(exc), 400, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        count("invalid_request")
        message, param = _validation_message(exc)
        return error_response(message, 400, param)

    @app.exception_handler(EngineOverloadedError)
    async def _overloaded(request: Request, exc: EngineOverloadedError):
        count("overloaded")
        return error_response(str(exc), 503, headers={"Retry-After": "1"})

    @app.exception_handler(EngineDeadError)
    async def _dead(request: Request, exc: EngineDeadError):
        count("engine_dead")
        return error_response(f"the engine is not running: {exc}", 503)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        count(rejection_reason(exc.status_code))
        return error_response(str(exc.detail), exc.status_code, headers=exc.headers)
