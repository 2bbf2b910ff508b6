"""`pagoda-operator`: run the operator, cluster-wide or in listed namespaces.

    pagoda-operator --all-namespaces
    pagoda-operator --namespace team-a --namespace team-b
    pagoda-operator --namespace 'team-*' --metrics-port 9090
    pagoda-operator --standalone          # the only replica: no leader election

It embeds kopf (`kopf.operator`) instead of shelling out to `kopf run`, so the
operator's own pieces (metrics server, configuration, leader election) start
with it, and tests can run the very same coroutine in their event loop.

Replicas elect a leader on a Lease (election.py); only the leader runs kopf's
handlers, the others stand by. A leader that cannot renew the Lease stops
its handlers and exits with status 1, so its pod restarts as a standby
(client-go's OnStoppedLeading); one that is told to stop releases the Lease,
so a standby takes over at once. kopf's own peering is never used: it pauses
every peer of equal priority, so two replicas of it run no operator at all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kopf
from pagoda.operator import liveness, metrics
from pagoda.operator.api import KubeApi
from pagoda.operator.config import ConfigError, OperatorConfig
from pagoda.operator.election import LeaderElector, Lease, identity, pod_namespace

Flag = asyncio.Event | threading.Event


class LeadershipLost(RuntimeError):
    """The Lease could not be renewed in time: another replica may lead by now."""


@dataclass(frozen=True, slots=True)
class Options:
    """How to run: scope, leader election, probes, metrics."""

    namespaces: tuple[str, ...] = ()
    # The only replica: run at once, without the Lease.
    standalone: bool = False
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
    parser.add_argument(
        "--standalone", action="store_true",
        help="no leader election (run only one replica)",
    )  # fmt: skip
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
    stop_flag: Flag | None = None,
    ready_flag: Flag | None = None,
    memo: Mapping[str, Any] | None = None,
) -> None:
    """Run the operator until stop_flag is set (or forever).

    With leader election (not `standalone`), wait for the Lease first, run
    kopf while it is held, and raise `LeadershipLost` if it could not be
    renewed. `memo` seeds kopf's memo; the e2e harness puts its own network
    there (`scrape`: how pods' /metrics are read) to play faults a cluster has.
    """
    import pagoda.operator.main  # noqa: F401  (registers the handlers)

    config = config or OperatorConfig.from_env()
    if options.metrics_port is not None:
        metrics.serve(options.metrics_port)
    kopf_memo = kopf.Memo(config=config, **(memo or {}))
    if options.standalone:
        await _run_kopf(options, kopf_memo, stop_flag, ready_flag, options.liveness)
        return
    namespace = config.lease_namespace or pod_namespace()
    if not namespace:
        raise ConfigError(
            "leader election needs the Lease's namespace: set PAGODA_OPERATOR_LEASE_NAMESPACE "
            "or run in a pod (or pass --standalone)"
        )
    api = KubeApi.from_environment()
    elector = LeaderElector(
        api, Lease(namespace, config.lease_name), identity(), config.lease_timing()
    )
    stopping = asyncio.Event()
    try:
        async with (
            _stop_when(stop_flag, stopping),
            _liveness(options.liveness, lambda: elector.leading),
        ):
            with _signals_set(stopping):
                if not await elector.acquire(stopping):
                    return
            lost = await _lead(elector, options, kopf_memo, stopping, ready_flag)
        if lost:
            raise LeadershipLost(
                f"{elector.identity} lost the Lease {namespace}/{config.lease_name}"
            )
    finally:
        api.close()


async def _lead(
    elector: LeaderElector,
    options: Options,
    memo: kopf.Memo,
    stopping: asyncio.Event,
    ready_flag: Flag | None,
) -> bool:
    """Run kopf while the Lease is held; True if it was lost, False on a stop (released)."""
    kopf_stop = asyncio.Event()
    keeper = asyncio.create_task(elector.keep(stopping), name="lease renewal")
    keeper.add_done_callback(lambda _: kopf_stop.set())
    stopper = asyncio.create_task(stopping.wait(), name="stop watcher")
    stopper.add_done_callback(lambda _: kopf_stop.set())
    try:
        # kopf's liveness endpoint stays off: ours answers for the whole process.
        await _run_kopf(options, memo, kopf_stop, ready_flag, None)
    finally:
        # kopf also returns on SIGTERM, which it handles itself: stop renewing.
        stopping.set()
        lost = await keeper
        stopper.cancel()
        if not lost:
            await elector.release()
    return lost


async def _run_kopf(
    options: Options,
    memo: kopf.Memo,
    stop_flag: Flag | None,
    ready_flag: Flag | None,
    liveness_endpoint: str | None,
) -> None:
    await kopf.operator(
        clusterwide=options.clusterwide,
        namespaces=options.namespaces,
        # One operator at a time is the Lease's job (see the module's docstring).
        standalone=True,
        liveness_endpoint=liveness_endpoint,
        memo=memo,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


@contextlib.asynccontextmanager
async def _stop_when(flag: Flag | None, stopping: asyncio.Event) -> AsyncIterator[None]:
    """Set `stopping` when the caller's flag is set (a thread's Event is polled)."""

    async def follow() -> None:
        if isinstance(flag, asyncio.Event):
            await flag.wait()
        elif flag is not None:
            while not flag.is_set():
                await asyncio.sleep(0.1)
        else:
            return
        stopping.set()

    task = asyncio.create_task(follow(), name="stop flag")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def _liveness(url: str | None, leading: Callable[[], bool]) -> AsyncIterator[None]:
    if url is None:
        yield
        return
    async with liveness.serve(url, leading):
        yield


@contextlib.contextmanager
def _signals_set(stopping: asyncio.Event) -> Iterator[None]:
    """While standing by, SIGTERM and SIGINT end the wait (kopf handles them once it runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


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
    try:
        asyncio.run(serve(options, config=config))
    except ConfigError as e:
        print(f"pagoda-operator: {e}", file=sys.stderr)
        return 2
    except LeadershipLost as e:
        # Exit, as client-go's controllers do: the pod restarts as a standby.
        print(f"pagoda-operator: {e}", file=sys.stderr)
        return 1
    return 0
