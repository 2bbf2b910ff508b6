"""The operator's liveness endpoint: it answers whether this replica leads or stands by."""

from __future__ import annotations

import aiohttp
from pagoda.operator import liveness


async def test_the_endpoint_answers_for_a_standby_and_for_the_leader() -> None:
    leading = False
    async with (
        liveness.serve("http://127.0.0.1:0/healthz", lambda: leading) as port,
        aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session,
    ):
        async with session.get("/healthz") as response:
            assert response.status == 200 and await response.json() == {"leader": False}
        leading = True
        async with session.get("/healthz") as response:
            assert response.status == 200 and await response.json() == {"leader": True}
        async with session.get("/other") as response:
            assert response.status == 404
