"""Flags of `pagoda serve` beyond the engine's, each with a `PAGODA_*` twin."""

from __future__ import annotations

import argparse
import os

from pagoda.runtime.config import EngineArgs
from pagoda.runtime.entrypoints.cli_args import add_engine_args, engine_args_from, env_name
from pagoda.runtime.entrypoints.openai.api_server import ServerConfig

# (flag, type, default, help); the env twin is PAGODA_<FLAG_WITH_UNDERSCORES>.
_SERVER_FLAGS: list[tuple[str, type, object, str]] = [
    ("host", str, "0.0.0.0", "address to listen on"),
    ("port", int, 8000, "port to listen on"),
    ("served-model-name", str, None, "model name clients use (default: MODEL)"),
    ("api-key", str, None, "require `Authorization: Bearer KEY` on /v1 routes"),
    (
        "max-waiting-requests",
        int,
        1024,
        "beyond this many waiting requests, answer 503 + Retry-After; a request that "
        "alone has more sequences gets 400 (0: no limit)",
    ),
    (
        "max-request-body-bytes",
        int,
        4 * 2**20,
        "larger request bodies get 413, chunked ones too (0: no limit)",
    ),
    ("drain-timeout", float, 30.0, "SIGTERM: seconds to let in-flight requests finish"),
    (
        "engine-heartbeat-timeout",
        float,
        10.0,
        "the engine core silent this long counts as hung: /health 503, exit 1 (0: never)",
    ),
    (
        "engine-step-timeout",
        float,
        300.0,
        "one engine step taking this long counts as hung (0: never)",
    ),
    (
        "num-threads",
        int,
        None,
        "torch CPU threads of the engine core (default on the CPU: every core)",
    ),
    (
        "lora-adapters-file",
        str,
        None,
        "JSON list of {name, path}: LoRA adapters loaded before ready, then kept in sync "
        "with the file (needs --enable-lora)",
    ),
    ("lora-adapters-poll-interval", float, 2.0, "seconds between checks of --lora-adapters-file"),
    (
        "admin-port",
        int,
        None,
        "also listen on this port for the operator's routes (load/unload LoRA adapters, "
        "/v1/models, /health, /metrics); the adapter routes then leave --port "
        "(default: none, they stay on --port)",
    ),
    (
        "admin-key",
        str,
        None,
        "require `Authorization: Bearer KEY` on the admin port (independent of --api-key)",
    ),
]


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """Engine flags (MODEL positional) plus the server's own."""
    add_engine_args(parser, positional_model=True)
    for flag, kind, default, help_text in _SERVER_FLAGS:
        field = flag.replace("-", "_")
        env = os.environ.get(env_name(field))
        value = kind(env) if env is not None else default
        parser.add_argument(
            f"--{flag}", type=kind, default=value, help=f"{help_text} [env {env_name(field)}]"
        )


def server_config_from(ns: argparse.Namespace) -> tuple[EngineArgs, ServerConfig]:
    """Validated (engine args, server config); bad values raise ValueError naming the flag."""
    if not 0 < ns.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {ns.port}")
    if ns.admin_port is not None:
        if not 0 < ns.admin_port < 65536:
            raise ValueError(f"--admin-port must be in 1..65535, got {ns.admin_port}")
        if ns.admin_port == ns.port:
            raise ValueError(f"--admin-port must differ from --port ({ns.port})")
    elif ns.admin_key:
        raise ValueError("--admin-key needs --admin-port")
    if ns.drain_timeout < 0:
        raise ValueError(f"--drain-timeout must be non-negative, got {ns.drain_timeout}")
    if ns.max_waiting_requests < 0:
        raise ValueError(
            f"--max-waiting-requests must be non-negative, got {ns.max_waiting_requests}"
        )
    for flag in ("max_request_body_bytes", "engine_heartbeat_timeout", "engine_step_timeout"):
        if getattr(ns, flag) < 0:
            raise ValueError(
                f"--{flag.replace('_', '-')} must be non-negative, got {getattr(ns, flag)}"
            )
    args = engine_args_from(ns)
    if ns.lora_adapters_file and not args.enable_lora:
        raise ValueError("--lora-adapters-file needs --enable-lora")
    if ns.lora_adapters_poll_interval <= 0:
        raise ValueError(
            f"--lora-adapters-poll-interval must be positive, got {ns.lora_adapters_poll_interval}"
        )
    config = ServerConfig(
        host=ns.host,
        port=ns.port,
        served_model_name=ns.served_model_name or args.model,
        api_key=ns.api_key or None,
        max_waiting_requests=ns.max_waiting_requests or None,
        max_request_body_bytes=ns.max_request_body_bytes or None,
        drain_timeout=ns.drain_timeout,
        engine_heartbeat_timeout=ns.engine_heartbeat_timeout or None,
        engine_step_timeout=ns.engine_step_timeout or None,
        num_threads=ns.num_threads,
        log_level=ns.log_level,
        lora_adapters_file=ns.lora_adapters_file,
        lora_adapters_poll_interval=ns.lora_adapters_poll_interval,
        admin_port=ns.admin_port,
        admin_key=ns.admin_key or None,
    )
    return args, config
