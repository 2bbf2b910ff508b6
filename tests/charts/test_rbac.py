"""The chart's RBAC, derived from what the operator actually calls.

The operator (kopf and the official client) runs against the simulated API
server through a scenario that exercises every code path that talks to the
API: leader election on its Lease, removing the finalizer earlier versions
added, creating children of an LLMService with a Secret and a claim to check, scaling (which deletes the PodDisruptionBudget),
status, Events, and deletion. Every request it made becomes a (verb, group, resource) triple, and
the roles the chart renders must grant exactly those: every one of them, and
nothing else except the few grants listed below with the reason each is
needed although no request shows it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp.web
import pytest
from kubesim.apiserver import APPLY, ApiServer
from kubesim.http import serve_app
from kubesim.operator import OperatorThread, write_kubeconfig
from kubesim.resources import declare
from kubesim.testing import (
    DEPLOYMENTS,
    LLMS,
    NS,
    PDBS,
    create,
    delete,
    eventually,
    exists,
    llmservice,
    obj,
    patch,
    path_of,
)
from pagoda.operator.cli import Options
from pagoda.operator.config import OperatorConfig
from pagoda.operator.handlers import FINALIZER
from pagoda.operator.render.labels import OWNER_LABEL

from .test_pagoda import by_kind, template

# The release's namespace, where the operator's Lease lives.
RELEASE_NAMESPACE = "pagoda-system"
LEASE_RESOURCES = {"leases"}
SCALEDOBJECTS = "keda.sh/v1alpha1/scaledobjects"


@dataclass(frozen=True, order=True)
class Grant:
    """One verb on one resource (resource/subresource), as RBAC spells it."""

    verb: str
    group: str
    resource: str


# Needed although no request of the scenario shows it, and why.
IMPLIED = {
    # OwnerReferencesPermissionEnforcement: setting blockOwnerDeletion on a
    # child needs `update` on the owner's finalizers subresource.
    Grant("update", "pagoda.dev", "llmservices/finalizers"): "blockOwnerDeletion on children",
}
# Namespaced mode only: kopf follows namespaces to match --namespace patterns.
NAMESPACED_ONLY = {Grant("list", "", "namespaces"), Grant("watch", "", "namespaces")}
# Secrets: each LLMService's admin Secret is read and applied; the API key's
# Secret is read. Never listed or watched, never deleted.
SECRETS = {Grant(verb, "", "secrets") for verb in ("get", "create", "patch")}
CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces"}


def grants_of(request: Any) -> set[Grant]:
    """The RBAC grants one recorded request needed."""
    resource = request.resource
    if resource is None or resource.plural is None:
        return set()  # discovery and /version: allowed to every authenticated user
    name = resource.plural + (f"/{request.subresource}" if request.subresource else "")
    method = str(request.method.value).upper()
    params = dict(request.params)
    group = resource.group or ""
    if method == "GET":
        verb = "watch" if params.get("watch") == "true" else ("get" if request.name else "list")
        return {Grant(verb, group, name)}
    headers = {k.lower(): v for k, v in dict(request.headers).items()}
    if method == "PATCH" and headers.get("content-type", "").startswith(APPLY):
        if request.subresource:
            return {Grant("patch", group, name)}  # a subresource's object must exist already
        # An apply that finds no object creates it: the API server checks both.
        return {Grant("patch", group, name), Grant("create", group, name)}
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]
    return {Grant(verb, group, name)}


def operator_requests(server: ApiServer) -> list[Any]:
    # The test's own requests come from kmock's client.
    return [
        r
        for r in list(server)
        if not {k.lower(): v for k, v in dict(r.headers).items()}.get("user-agent", "").startswith(
            "kmock"
        )
    ]


@pytest.fixture()
def kmock_options() -> dict[str, Any]:
    return {"cls": ApiServer}


@pytest.fixture(scope="module")
def calls() -> set[Grant]:
    """Everything the operator called in the scenario (run once for this module)."""
    return asyncio.run(_record())


async def _record() -> set[Grant]:
    import tempfile

    import kmock

    async with ApiServer() as server, kmock.Server(server):
        declare(server)
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", str(server.url))
            import os

            before = os.environ.get("KUBECONFIG")
            os.environ["KUBECONFIG"] = str(kubeconfig)
            try:
                await _scenario(server)
            finally:
                if before is None:
                    del os.environ["KUBECONFIG"]
                else:
                    os.environ["KUBECONFIG"] = before
        return set().union(*(grants_of(r) for r in operator_requests(server)))


async def _scenario(server: ApiServer) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keys", "namespace": NS}}
    await create(server, {**secret, "data": {"api-key": "c2VjcmV0"}})
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models", "namespace": NS},
    }
    await create(server, claim)
    # Left by an operator version that ran kopf daemons: removed on start.
    upgraded = llmservice("upgraded", replicas=0)
    upgraded["metadata"]["finalizers"] = [FINALIZER]
    await create(server, upgraded)
    options = Options(liveness=None, metrics_port=None)  # elects itself on the Lease
    config = OperatorConfig(
        resync_seconds=0.5,
        settle_seconds=0.05,
        lease_namespace=RELEASE_NAMESPACE,
        lease_duration_seconds=3.0,
        renew_deadline_seconds=2.0,
        retry_period_seconds=0.2,  # renewals (updates) within the scenario
    )
    async with OperatorThread(config, options):
        await eventually(lambda: not obj(server, LLMS, "upgraded")["metadata"].get("finalizers"))
        body = llmservice(replicas=2, model="pvc://models/llama", apiKeySecretRef={"name": "keys"})
        await create(server, body)
        await eventually(lambda: exists(server, PDBS, "chat"), timeout=20)
        await eventually(lambda: obj(server, LLMS, "chat")["status"]["conditions"])
        await patch(server, path_of(LLMS, NS, "chat"), {"spec": {"replicas": 1}})
        await eventually(lambda: not exists(server, PDBS, "chat"))
        await asyncio.sleep(1.0)
        await delete(server, LLMS, "chat")
        await eventually(lambda: not exists(server, LLMS, "chat"))
        assert exists(server, DEPLOYMENTS, "chat")  # left to the garbage collector
        await _autoscaling(server)


async def _autoscaling(server: ApiServer) -> None:
    """The built-in autoscaler scales a busy pod's LLMService; KEDA mode comes and goes."""
    app = aiohttp.web.Application()

    async def busy(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text="vllm:num_requests_waiting 40\n")

    app.router.add_get("/metrics", busy)
    async with serve_app(app) as base_url:
        port = urlsplit(base_url).port
        auto = {"maxReplicas": 4, "metricsIntervalSeconds": 1}
        await create(server, llmservice("auto", autoscaling=auto))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "auto-1",
                "namespace": NS,
                "labels": {
                    "app.kubernetes.io/name": "pagoda-runtime",
                    "app.kubernetes.io/managed-by": "pagoda-operator",
                    OWNER_LABEL: "auto",
                },
                "annotations": {"prometheus.io/port": str(port)},
            },
            "status": {
                "podIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        await create(server, pod)
        await eventually(lambda: obj(server, LLMS, "auto")["spec"]["replicas"] > 1, timeout=20)
        keda = {"mode": "keda", "keda": {"serverAddress": "http://prometheus:9090"}}
        await patch(server, path_of(LLMS, NS, "auto"), {"spec": {"autoscaling": keda}})
        await eventually(lambda: exists(server, SCALEDOBJECTS, "auto"))
        await patch(server, path_of(LLMS, NS, "auto"), {"spec": {"autoscaling": None}})
        await eventually(lambda: not exists(server, SCALEDOBJECTS, "auto"))


def granted(roles: list[dict[str, Any]]) -> set[Grant]:
    """Everything some rule of these roles allows (no wildcards: asserted elsewhere)."""
    return {
        Grant(verb, group, resource)
        for role in roles
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_scenario_exercised_every_kind_of_call(calls: set[Grant]) -> None:
    verbs = {(g.verb, g.resource) for g in calls}
    assert {
        ("create", "deployments"),
        ("patch", "llmservices/status"),
        ("delete", "poddisruptionbudgets"),
        ("patch", "llmservices/scale"),
        ("create", "scaledobjects"),
        ("delete", "scaledobjects"),
    } <= verbs
    assert {
        ("watch", "pods"),
        ("list", "endpointslices"),
        ("get", "secrets"),
        ("create", "events"),
    } <= verbs
    assert {("get", "leases"), ("create", "leases"), ("update", "leases")} <= verbs


def lease_calls(calls: set[Grant]) -> set[Grant]:
    return {g for g in calls if g.resource in LEASE_RESOURCES}


def leader_election_role(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (role,) = [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("-election")]
    return role


@pytest.mark.parametrize("values", [None, {"watchNamespaces": [NS]}], ids=["cluster", "scoped"])
def test_the_lease_role_grants_exactly_the_leader_elections_calls(
    calls: set[Grant], helm: Path, tmp_path: Path, values: dict[str, Any] | None
) -> None:
    objects = template(helm, tmp_path, values)
    role = leader_election_role(objects)
    assert role["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert granted([role]) == lease_calls(calls)
    others = [r for r in by_kind(objects, "Role") + by_kind(objects, "ClusterRole") if r != role]
    assert not {g.resource for g in granted(others)} & LEASE_RESOURCES


def test_cluster_wide_rbac_grants_what_the_operator_calls_and_nothing_else(
    calls: set[Grant], helm: Path, tmp_path: Path
) -> None:
    objects = template(helm, tmp_path)
    have = granted(by_kind(objects, "ClusterRole"))
    assert by_kind(objects, "Role") == [leader_election_role(objects)]
    calls = calls - lease_calls(calls)  # granted by their own Role (test above)
    missing = calls - have
    assert not missing, f"calls the chart does not grant: {sorted(missing)}"
    extra = have - calls - set(IMPLIED)
    assert not extra, f"grants no call needs: {sorted(extra)}"


def test_secrets_are_only_read_and_applied_never_listed(
    calls: set[Grant], helm: Path, tmp_path: Path
) -> None:
    assert {g for g in calls if g.resource == "secrets"} == SECRETS
    have = granted(by_kind(template(helm, tmp_path), "ClusterRole"))
    assert {g for g in have if g.resource == "secrets"} == SECRETS


def test_namespaced_rbac_grants_the_same_per_namespace(
    calls: set[Grant], helm: Path, tmp_path: Path
) -> None:
    objects = template(helm, tmp_path, {"watchNamespaces": [NS, "team-b"]})
    wanted = (calls - lease_calls(calls)) | set(IMPLIED)
    cluster_role = granted(by_kind(objects, "ClusterRole"))
    served = [r for r in by_kind(objects, "Role") if r != leader_election_role(objects)]
    assert sorted(r["metadata"]["namespace"] for r in served) == sorted([NS, "team-b"])
    for role in served:
        have = granted([role]) | cluster_role
        missing = wanted - have
        assert not missing, f"{role['metadata']['namespace']}: not granted {sorted(missing)}"
        assert {g for g in granted([role]) if g.resource == "secrets"} == SECRETS
        assert not (have - wanted - NAMESPACED_ONLY), sorted(have - wanted)
    assert {g.resource for g in cluster_role} <= CLUSTER_SCOPED
