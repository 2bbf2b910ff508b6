"""The operator's own Prometheus metrics (not the runtime's: those live on each pod)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "pagoda_operator_reconciles",
    "Reconciles of LLMServices, by trigger (create, update, resume, resync) and result "
    "(ok, invalid, error).",
    ["trigger", "result"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "pagoda_operator_reconcile_duration_seconds",
    "Wall time of one reconcile, API round trips included.",
    ["trigger"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
CHILD_WRITES = Counter(
    "pagoda_operator_child_writes",
    "Writes to children, by kind and action (create, update, repair, delete). "
    "A steady cluster shows none; repairs mean someone edits our objects.",
    ["kind", "action"],
    registry=REGISTRY,
)

SCALE_DECISIONS = Counter(
    "pagoda_operator_scale_decisions",
    "Autoscaler ticks, by what was done (up, down, none) and the scaler's reason "
    "(Panic, AboveTarget, BelowTarget, WithinTolerance, CapacityComing...).",
    ["direction", "reason"],
    registry=REGISTRY,
)
SCRAPE_FAILURES = Counter(
    "pagoda_operator_scrape_failures",
    "Reads of a ready runtime pod's /metrics that failed, by reason (Timeout, "
    "Unreachable, HTTPError, Malformed). Such a pod is skipped, not counted as idle.",
    ["reason"],
    registry=REGISTRY,
)

LEADER = Gauge(
    "pagoda_operator_leader",
    "1 while this instance holds the operator's Lease and runs the handlers, 0 while it "
    "stands by. Summed over the replicas it is 1; 0 for longer than the lease duration "
    "means no operator is working.",
    ["lease"],
    registry=REGISTRY,
)


def serve(port: int, addr: str = "0.0.0.0") -> int:
    """Expose /metrics on a background thread; returns the bound port (0 picks one)."""
    server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
    return int(server.server_port)
