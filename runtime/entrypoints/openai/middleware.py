"""The server's one ASGI middleware: what every HTTP request passes first.

In order: the API key (every path but the probes'), refusal while draining or
after the engine died, the request-body size limit (413, also for chunked
bodies that carry no Content-Length), the in-flight count that draining waits
on, and a last-resort 500 that keeps the connection.

Pure ASGI rather than Starlette's BaseHTTPMiddleware, so a streaming response
counts as in flight until its last byte.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable

from pagoda.runtime.entrypoints.openai.errors import error_response
from starlette.requests import ClientDisconnect

logger = logging.getLogger(__name__)

# Paths that need no API key and keep answering while draining or after the
# engine died: probes and scrapes must see the truth, not a refusal. The API
# description stays readable too, so clients and fuzzers can be generated.
OPEN_PATHS = frozenset(
    {"/health", "/metrics", "/version", "/openapi.json", "/docs", "/docs/oauth2-redirect"}
)
# Beyond the limit, read (and drop) at most this much more of a body, so the
# 413 leaves on a connection the client can still read it from: closing a
# socket with unread data resets it.
_DRAIN_BYTES = 1 << 20


class ServerState:
    """What the middleware and the signal handler share."""

    def __init__(self) -> None:
        self.draining = False
        self.engine_dead = False
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()


class ServerMiddleware:
    """Pure ASGI middleware; `on_rejected(reason)` counts each refusal.

    `api_key` is the bearer token this listener asks for (None: none);
    `credential` names it in the 401's message."""

    def __init__(
        self,
        app,
        state: ServerState,
        api_key: str | None,
        max_body_bytes: int | None,
        on_rejected: Callable[[str], None] | None = None,
        credential: str = "API key",
    ):
        self.app = app
        self.state = state
        self.api_key = f"Bearer {api_key}".encode() if api_key else None
        self.credential = credential
        self.max_body_bytes = max_body_bytes
        self.on_rejected = on_rejected or (lambda reason: None)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] in OPEN_PATHS:
            return await self._guarded(scope, receive, send)
        refusal = self._refusal(scope)
        if refusal is not None:
            return await refusal(scope, receive, send)
        if self.max_body_bytes is not None and scope["method"] in ("POST", "PUT", "PATCH"):
            receive = await self._limited_body(scope, receive)
            if receive is None:
                self.on_rejected("body_too_large")
                response = error_response(
                    f"the request body is larger than {self.max_body_bytes} bytes "
                    "(--max-request-body-bytes)",
                    413,
                )
                return await response(scope, receive, send)
        state = self.state
        state.in_flight += 1
        state.idle.clear()
        try:
            await self._guarded(scope, receive, send)
        finally:
            state.in_flight -= 1
            if state.in_flight == 0:
                state.idle.set()

    def _refusal(self, scope):
        if self.api_key is not None:
            auth = dict(scope["headers"]).get(b"authorization", b"")
            # Constant time: the comparison must not leak the key's prefix.
            if not hmac.compare_digest(auth, self.api_key):
                self.on_rejected("unauthorized")
                return error_response(f"invalid or missing {self.credential}", 401)
        state = self.state
        if state.engine_dead:
            self.on_rejected("engine_dead")
            return error_response("the engine is not running", 503, headers={"Retry-After": "1"})
        if state.draining:
            self.on_rejected("draining")
            return error_response("the server is shutting down", 503, headers={"Retry-After": "1"})
        return None

    async def _limited_body(self, scope, receive):
        """A `receive` that replays the whole body, or None when it is too large."""
        limit = self.max_body_bytes
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return None
        messages = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > limit:
                await _drain(receive, message)
                return None
            if not message.get("more_body", False):
                break
        replay = iter(messages)

        async def replaying_receive():
            return next(replay, None) or await receive()

        return replaying_receive

    async def _guarded(self, scope, receive, send):
        """Run the app; an unexpected exception becomes OpenAI's 500 here, as a
        normal response, so the keep-alive connection survives (re-raised,
        uvicorn would close it and the client's next request would be reset)."""
        started = False

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            return  # gone while its body was read: nobody to answer
        except Exception as exc:
            logger.exception("unexpected error in %s %s", scope["method"], scope["path"])
            if started:
                return  # mid-stream: nothing more can be said on this response
            self.on_rejected("internal_error")
            response = error_response(f"internal error: {type(exc).__name__}", 500)
            await response(scope, receive, send)


async def _drain(receive, last) -> None:
    dropped = 0
    message = last
    while message.get("more_body", False) and dropped < _DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            return
        dropped += len(message.get("body", b""))
