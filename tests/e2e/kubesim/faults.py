"""Network faults between the operator and the pods: a pod's /metrics that stops answering.

On a real cluster a pod can be Ready (its kubelet's probe passes) while the
operator cannot read its metrics: a NetworkPolicy that lets the kubelet in
but not the operator, a node whose route to the operator's node is down, a
metrics endpoint that hangs. `MetricsNetwork` plays that here. It is the
operator's way of reading pods' /metrics (kopf's memo `scrape`); for a pod
whose metrics were killed it connects to a port on the pod's address where
nothing listens, so the operator's real HTTP client meets a real refused
connection. Everything else goes through untouched.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from kubesim.network import free_port
from pagoda.operator.scrape import HttpFetch


class MetricsNetwork:
    """The operator's `Fetch`, with per-address faults."""

    def __init__(self) -> None:
        self._http = HttpFetch()
        self._dead: dict[str, int] = {}  # pod IP -> a port nothing listens on

    def kill_metrics(self, ip: str) -> None:
        """From now on, reading metrics at `ip` is refused."""
        self._dead[ip] = free_port(ip)

    def revive_metrics(self, ip: str) -> None:
        """Undo `kill_metrics`."""
        self._dead.pop(ip, None)

    async def __call__(self, url: str, timeout: float) -> str:
        parts = urlsplit(url)
        port = self._dead.get(parts.hostname or "")
        if port is not None:
            url = urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}"))
        return await self._http(url, timeout)

    async def close(self) -> None:
        """Close the HTTP session."""
        await self._http.close()
