"""A proxy that frames every response the way a real API server frames large ones.

kube-apiserver streams any body over a couple of KiB with
`Transfer-Encoding: chunked` and no `Content-Length`; kmock always sends
`Content-Length`. A client that reads a body only when Content-Length is set
(the defect this exists to catch) sees `{}` behind this proxy, as it would on
a real cluster. Watch streams pass through chunk by chunk.
"""

from __future__ import annotations

import contextlib
from types import TracebackType

import aiohttp
import aiohttp.web
from kubesim.http import serve_app

# Hop-by-hop and framing headers: the proxy sets its own framing.
_DROPPED = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


class ChunkingProxy:
    """`async with ChunkingProxy(upstream_url) as proxy:` then point clients at `proxy.url`."""

    def __init__(self, upstream: str, chunk_size: int = 512) -> None:
        self.upstream = upstream.rstrip("/")
        self.chunk_size = chunk_size
        self.chunked_responses = 0
        self._server: contextlib.AbstractAsyncContextManager[str] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def __aenter__(self) -> ChunkingProxy:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = aiohttp.web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._server = serve_app(app, shutdown_timeout=1.0)
        self.url = await self._server.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None and self._session is not None
        # Upstream first: open watch streams then end, and so do their handlers.
        await self._session.close()
        await self._server.__aexit__(exc_type, exc, tb)

    async def _forward(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in {"host", *_DROPPED}}
        body = await request.read()
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=body or None,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        ) as upstream:
            response = aiohttp.web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _DROPPED:
                    response.headers[key] = value
            response.enable_chunked_encoding()
            await response.prepare(request)
            self.chunked_responses += 1
            try:
                async for chunk in upstream.content.iter_chunked(self.chunk_size):
                    await response.write(chunk)
            except (aiohttp.ClientError, ConnectionError):
                return response  # the proxy is closing, or the client went away
            await response.write_eof()
            return response
