"""`pagoda-operator`: run the operator, cluster-wide or in listed namespaces.

    pagoda-operator --all-namespaces
    pagoda-operator --namespace team-a --namespace team-b
    pagoda-operator --namespace 'team-*' --metrics-port 9090

It embeds kopf (`kopf.operator`) instead of shelling out to `kopf run`, so the
operator's own pieces (metrics server, configuration) start with it, and tests
can run the very same coroutine in their event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kopf
from pagoda.operator import metrics
from pagoda.operator.config import ConfigError, OperatorConfig


@dataclass(frozen=True, slots=True)
class Options:
    """How to run: scope, peering, probes, metrics."""

    namespaces: tuple[str, ...] = ()
    standalone: bool = False
    peering: str = "pagoda-operator"
    priority: int = 0
    liveness: str | None = "http://0.0.0.0:8080/healthz"
    metrics_port: int | None = 9090
    verbose: bool = False
    debug: bool = False
    log_format: str = "full"

    @property
    def clusterwide(self) -> bool:
        """No namespaces listed means all of them."""
        return not self.namespaces


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Command-line flags; PAGODA_OPERATOR_NAMESPACES (comma-separated) is the default scope."""
    parser = argparse.ArgumentParser(prog="pagoda-operator", description=__doc__.split("\n")[0])
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=None,
        help="watch this namespace (repeatable; globs like 'team-*' work)",
    )  # fmt: skip
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument("--standalone", action="store_true", help="no peering (one instance only)")
    parser.add_argument("--peering", default="pagoda-operator", help="peering object name")
    parser.add_argument("--priority", type=int, default=0, help="peering priority")
    parser.add_argument(
        "--liveness", default="http://0.0.0.0:8080/healthz",
        help="liveness endpoint URL, or 'none'",
    )  # fmt: skip
    parser.add_argument("--metrics-port", type=int, default=9090, help="-1 disables /metrics")
    parser.add_argument("--log-format", choices=["plain", "full", "json"], default="full")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)

    namespaces: tuple[str, ...] = ()
    if args.namespace:
        namespaces = tuple(args.namespace)
    elif not args.all_namespaces:
        env = os.environ.get("PAGODA_OPERATOR_NAMESPACES", "")
        namespaces = tuple(ns.strip() for ns in env.split(",") if ns.strip())
    return Options(
        namespaces=namespaces,
        standalone=args.standalone,
        peering=args.peering,
        priority=args.priority,
        liveness=None if args.liveness == "none" else args.liveness,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        verbose=args.verbose,
        debug=args.debug,
        log_format=args.log_format,
    )


async def serve(
    options: Options,
    *,
    config: OperatorConfig | None = None,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    memo: Mapping[str, Any] | None = None,
) -> None:
    """Run the operator until stop_flag is set (or forever).

    `memo` seeds kopf's memo; the e2e harness puts its own network there
    (`scrape`: how pods' /metrics are read) to play faults a cluster has.
    """
    import pagoda.operator.main  # noqa: F401  (registers the handlers)

    if options.metrics_port is not None:
        metrics.serve(options.metrics_port)
    memo = kopf.Memo(config=config or OperatorConfig.from_env(), **(memo or {}))
    await kopf.operator(
        clusterwide=options.clusterwide,
        namespaces=options.namespaces,
        standalone=options.standalone,
        # Naming a peering makes it mandatory in kopf, even when standalone.
        peering_name=None if options.standalone else options.peering,
        priority=options.priority,
        liveness_endpoint=options.liveness,
        memo=memo,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `pagoda-operator` and `python -m pagoda.operator`."""
    options = parse_args(argv)
    kopf.configure(
        debug=options.debug,
        verbose=options.verbose,
        log_format=kopf.LogFormat[options.log_format.upper()],
    )
    try:
        config = OperatorConfig.from_env()
    except ConfigError as e:
        print(f"pagoda-operator: {e}", file=sys.stderr)
        return 2
    asyncio.run(serve(options, config=config))
    return 0
