"""A stand-in HTTP server for tests: an aiohttp app on 127.0.0.1 at a free port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiohttp.web


@contextlib.asynccontextmanager
async def serve_app(
    app: aiohttp.web.Application, shutdown_timeout: float = 60.0
) -> AsyncIterator[str]:
    """`async with serve_app(app) as base_url:` (`http://127.0.0.1:PORT`); the
    server stops on exit, waiting up to `shutdown_timeout` for open handlers."""
    runner = aiohttp.web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
