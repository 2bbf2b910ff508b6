"""The admin listener: the routes only an operator should call, on a port of their own.

`--admin-port` opens a second listening socket in the same process and the
same uvicorn server (one event loop, one graceful shutdown that closes both).
It serves `/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, the read-only
`/v1/models` listing the caller converges against, and `/health` and
`/metrics` for probes and scrapes. Its credential, `--admin-key`
(`PAGODA_ADMIN_KEY`), is a bearer token of its own: the users' `--api-key`
does not open it, nor does the admin key open the public API. With the admin
port on, the public port no longer serves the adapter routes (404), so a
client of the Service cannot load or unload adapters; the Service exposes
only the public port.

Without `--admin-port` the server keeps vLLM's shape: one port, the adapter
routes on it behind `--api-key`.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, Response
from pagoda.runtime.engine.async_llm import AsyncLLM
from pagoda.runtime.entrypoints.openai.errors import install_error_handlers
from pagoda.runtime.entrypoints.openai.lora_routes import install_lora_routes
from pagoda.runtime.entrypoints.openai.middleware import ServerMiddleware, ServerState
from pagoda.runtime.entrypoints.openai.protocol import ModelList

logger = logging.getLogger(__name__)

Endpoint = Callable[[], Awaitable[Any]]
ASGIApp = Callable[..., Awaitable[None]]


def build_admin_app(
    engine: AsyncLLM,
    state: ServerState,
    admin_key: str | None,
    *,
    health: Endpoint,
    metrics: Endpoint,
    models: Endpoint,
) -> FastAPI:
    """The admin app: the public app's `health`, `metrics` and `models`
    endpoints (shared, so both ports say the same) and the adapter routes,
    behind `admin_key`. It shares the server's state: draining refuses its
    calls too, and waits for those in flight."""
    # No API description: the admin routes are the operator's contract, not a client API.
    app = FastAPI(title="Pagoda admin", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.add_middleware(
        ServerMiddleware,
        state=state,
        api_key=admin_key,
        max_body_bytes=64 * 2**10,  # adapter calls are a few hundred bytes
        credential="admin key",
    )
    app.add_api_route("/health", health, methods=["GET"], response_class=Response)
    app.add_api_route("/metrics", metrics, methods=["GET"], response_class=PlainTextResponse)
    app.add_api_route("/v1/models", models, methods=["GET"], response_model=ModelList)
    install_lora_routes(app, engine)
    return app


class ByPort:
    """An ASGI app that hands each connection to the app of the port it came in on.

    `scope["server"]` is the listening socket's own address, so the port
    tells the listeners apart (they share the host). Lifespan events go to
    `default`, the public app.
    """

    def __init__(self, default: ASGIApp, by_port: Mapping[int, ASGIApp]) -> None:
        self.default = default
        self.by_port = dict(by_port)

    async def __call__(self, scope, receive, send) -> None:
        server = scope.get("server")
        app = self.by_port.get(server[1], self.default) if server else self.default
        await app(scope, receive, send)


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port, as uvicorn binds its own (SO_REUSEADDR,
    IPv6 for a host with a colon). Raises OSError naming the address when
    the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror}") from None
    return sock
