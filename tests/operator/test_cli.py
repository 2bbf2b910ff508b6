"""The `pagoda-operator` command line."""

from __future__ import annotations

import pytest
from pagoda.operator.cli import parse_args


def test_default_is_cluster_wide_with_leader_election(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGODA_OPERATOR_NAMESPACES", raising=False)
    options = parse_args([])
    assert options.clusterwide and not options.standalone and options.metrics_port == 9090
    assert options.liveness == "http://0.0.0.0:8080/healthz"


def test_kopfs_peering_flags_are_gone() -> None:
    # Peering pauses every peer of equal priority: replicas elect on the Lease.
    for flag in ("--peering=pagoda-operator", "--priority=1"):
        with pytest.raises(SystemExit):
            parse_args([flag])


def test_namespaces_from_flags_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_args(["-n", "a", "--namespace", "team-*"]).namespaces == ("a", "team-*")
    monkeypatch.setenv("PAGODA_OPERATOR_NAMESPACES", "x, y")
    assert parse_args([]).namespaces == ("x", "y")
    assert parse_args(["--all-namespaces"]).clusterwide


def test_probes_and_metrics_can_be_disabled() -> None:
    options = parse_args(["--liveness", "none", "--metrics-port", "-1", "--standalone"])
    assert options.liveness is None and options.metrics_port is None and options.standalone


def test_scope_flags_are_exclusive() -> None:
    with pytest.raises(SystemExit):
        parse_args(["-A", "-n", "a"])
