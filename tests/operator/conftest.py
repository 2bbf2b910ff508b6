"""Fixtures for the operator tests: the simulated API server and the operator.

The API server is `kubesim.ApiServer` (kmock plus the real server's behaviour
the operator relies on: resource versions, subresources, label selectors,
server-side apply with field owners). The operator runs as in production,
finding the API through $KUBECONFIG.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubesim.apiserver import ApiServer
from kubesim.operator import OperatorThread, write_kubeconfig
from kubesim.resources import declare
from pagoda.operator.config import OperatorConfig
from pagoda.operator.model import ResourcesSpec

CONFIG = OperatorConfig(
    runtime_image="registry.test/pagoda-runtime:1",
    profiles={"h100": ResourcesSpec(gpus=1, gpu_type="NVIDIA-H100-80GB-HBM3", memory="64Gi")},
    # Short, for the few tests of what only the resync notices (objects not
    # watched: a Secret created later, a user's object of the same name).
    resync_seconds=1.0,
    settle_seconds=0.05,
)


@pytest.fixture()
def kmock_options() -> dict[str, Any]:
    """The `kmock` fixture serves our ApiServer."""
    return {"cls": ApiServer}


@pytest.fixture()
def cluster(kmock: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ApiServer:
    """The API server, with our resources declared and a kubeconfig that points at it."""
    declare(kmock)
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url))))
    return kmock


@pytest.fixture()
def operator_config() -> OperatorConfig:
    """The configuration the `operator` fixture runs with."""
    return CONFIG


@pytest.fixture()
def run_operator(cluster: ApiServer) -> Callable[..., Any]:
    """Factory: `async with run_operator(config):` runs the operator with that configuration."""

    @contextlib.asynccontextmanager
    async def run(config: OperatorConfig = CONFIG) -> AsyncIterator[OperatorThread]:
        async with OperatorThread(config) as running:
            yield running

    return run


@pytest.fixture()
async def operator(
    cluster: ApiServer, run_operator: Callable[..., Any]
) -> AsyncIterator[ApiServer]:
    """The operator with the test configuration, running against `cluster`."""
    async with run_operator():
        yield cluster
