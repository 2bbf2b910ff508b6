"""kube-proxy: each Service gets a cluster IP, and connections to it reach a ready pod.

The API server would allocate `spec.clusterIP`; here the proxy does, writes it
into the Service as the field manager `kube-apiserver` (so the operator's
server-side apply must leave it alone), and listens there on the Service's
port. Where that port cannot be bound (below 1024 without root), it listens
on a free port instead; `url()` says where. Each connection goes to the next
ready endpoint of the Service's EndpointSlices (round robin), to the target
port named in the slice.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass
from typing import Any

from kubesim.apiserver import MERGE, ApiServer
from kubesim.network import AddressPool, bindable, free_port
from kubesim.testing import ENDPOINTSLICES, SERVICES, path_of

log = logging.getLogger("kubesim.proxy")


@dataclass
class Forwarder:
    """The listener of one Service port."""

    namespace: str
    service: str
    uid: str
    ip: str
    port: int
    port_name: str
    server: asyncio.AbstractServer


class ServiceProxy:
    """Listens on every Service's cluster IP and forwards to its ready endpoints."""

    def __init__(self, api: ApiServer, addresses: AddressPool) -> None:
        self.api = api
        self.addresses = addresses
        self._forwarders: dict[tuple[str, str], Forwarder] = {}
        self._turn = itertools.count()

    def url(self, service: str, namespace: str) -> str:
        """http://IP:PORT of a Service, once the proxy serves it."""
        forwarder = self._forwarders[namespace, service]
        return f"http://{forwarder.ip}:{forwarder.port}"

    async def sync(self) -> None:
        """Serve new Services, stop serving deleted ones."""
        live = {
            (s["metadata"]["namespace"], s["metadata"]["name"]): s
            for s in self.api.list_objects(SERVICES)
        }
        for key, forwarder in list(self._forwarders.items()):
            service = live.get(key)
            if service is None or service["metadata"]["uid"] != forwarder.uid:
                forwarder.server.close()
                del self._forwarders[key]
        for key, service in live.items():
            if key not in self._forwarders and (service.get("spec") or {}).get("ports"):
                await self._serve(service)

    async def close(self) -> None:
        """Stop every listener."""
        for forwarder in self._forwarders.values():
            forwarder.server.close()
        self._forwarders.clear()

    async def _serve(self, service: dict[str, Any]) -> None:
        meta, port = service["metadata"], service["spec"]["ports"][0]
        wanted = int(port["port"])
        ip = self.addresses.allocate()
        listen = wanted if bindable(ip, wanted) else free_port(ip)
        key = (meta["namespace"], meta["name"])
        server = await asyncio.start_server(
            lambda r, w: self._connect(key, r, w), host=ip, port=listen
        )
        self._forwarders[key] = Forwarder(
            meta["namespace"], meta["name"], meta["uid"], ip, listen, port.get("name", ""), server
        )
        path = path_of(SERVICES, meta["namespace"], meta["name"])
        body = {"spec": {"clusterIP": ip, "clusterIPs": [ip]}}
        params = {"fieldManager": "kube-apiserver"}
        async with self.api.patch(path, json=body, headers={"Content-Type": MERGE}, params=params):
            pass

    def _endpoints(self, key: tuple[str, str]) -> list[tuple[str, int]]:
        namespace, name = key
        port_name = self._forwarders[key].port_name
        found = []
        for endpoint_slice in self.api.list_objects(ENDPOINTSLICES, namespace):
            labels = endpoint_slice["metadata"].get("labels") or {}
            if labels.get("kubernetes.io/service-name") != name:
                continue
            ports = [p for p in endpoint_slice.get("ports") or [] if p.get("name", "") == port_name]
            if not ports:
                continue
            for endpoint in endpoint_slice.get("endpoints") or []:
                if (endpoint.get("conditions") or {}).get("ready") is not False:
                    found += [(address, int(ports[0]["port"])) for address in endpoint["addresses"]]
        return found

    async def _connect(
        self, key: tuple[str, str], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        endpoints = self._endpoints(key)
        if not endpoints:
            writer.close()  # no ready endpoint: the connection is refused
            return
        address, port = endpoints[next(self._turn) % len(endpoints)]
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(address, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer)
        )

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
