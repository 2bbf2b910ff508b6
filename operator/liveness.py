"""The operator's liveness endpoint, served by the process whether it leads or stands by.

kopf's own endpoint exists only while kopf runs, that is while this replica
leads; a standby without one would be restarted by its liveness probe over
and over. This one answers as long as the event loop does, which is what
kopf's answers too when no `@kopf.on.probe` handler is registered.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import aiohttp.web


@contextlib.asynccontextmanager
async def serve(url: str, leading: Callable[[], bool]) -> AsyncIterator[int]:
    """Answer GET on `url`'s path with 200 and whether this replica leads; yields the port."""
    parts = urlsplit(url)
    path = parts.path or "/"

    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response({"leader": leading()})

    app = aiohttp.web.Application()
    app.router.add_get(path, healthz)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, parts.hostname or "0.0.0.0", parts.port or 80)
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()
