"""The operator's one HTTP client to runtime pods (their /metrics and admin API).

Plain HTTP to a pod's IP, never through the Kubernetes API. One connection per
call, no pool: pods come and go, and a pooled connection to a pod replaced at
the same address would talk to another pod. Bodies are capped: a pod is not
trusted to send a bounded answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

MAX_BODY = 1 << 20


class PodHttpError(Exception):
    """No HTTP answer: `reason` is Timeout or Unreachable."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class PodHttp:
    """`request()` over one aiohttp session, created on first use."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def request(
        self,
        method: str,
        url: str,
        timeout: float,
        json: dict[str, Any] | None = None,
        max_body: int = MAX_BODY,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """(status, body) with at most `max_body + 1` bytes read (so "too long" shows)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True), trust_env=False
            )
        try:
            async with self._session.request(
                method,
                url,
                json=json,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                return response.status, await response.content.read(max_body + 1)
        except TimeoutError:
            raise PodHttpError("Timeout", f"{url}: no answer within {timeout:g} s") from None
        except aiohttp.ClientError as e:
            raise PodHttpError("Unreachable", f"{url}: {e}") from None

    async def close(self) -> None:
        """Close the session (operator shutdown)."""
        if self._session is not None:
            await self._session.close()
