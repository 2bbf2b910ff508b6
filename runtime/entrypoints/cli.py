"""The `pagoda` command."""

from __future__ import annotations

import argparse
import logging
import sys

from pagoda.runtime.entrypoints.cli_args import add_engine_args, engine_args_from
from pagoda.runtime.sampling_params import InvalidRequestError


def _generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate a completion offline and print it")
    add_engine_args(p)
    p.add_argument("--prompt", action="append", required=True, help="prompt (repeatable)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--sample-seed", type=int, default=None, help="seed of the sampling")
    p.add_argument("--stop", action="append", default=[])
    p.set_defaults(func=_run_generate)


def _run_generate(ns: argparse.Namespace) -> int:
    from pagoda.runtime.entrypoints.llm import LLM
    from pagoda.runtime.sampling_params import SamplingParams

    args = engine_args_from(ns)
    params = SamplingParams(
        temperature=ns.temperature,
        top_p=ns.top_p,
        top_k=ns.top_k,
        seed=ns.sample_seed,
        max_tokens=ns.max_tokens,
        stop=ns.stop,
    )
    llm = LLM(**vars(args))
    if ns.chat:
        convs = [[{"role": "user", "content": p}] for p in ns.prompt]
        outputs = llm.chat(convs, params)
    else:
        outputs = llm.generate(ns.prompt, params)
    for out in outputs:
        print(out.outputs[0].text)
    return 0


def _serve_parser(sub) -> None:
    from pagoda.runtime.entrypoints.openai.cli_args import add_server_args

    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    add_server_args(p)
    p.set_defaults(func=_run_serve)


def _run_serve(ns: argparse.Namespace) -> int:
    from pagoda.runtime.engine.core_client import EngineStartupError
    from pagoda.runtime.entrypoints.openai.api_server import run_server
    from pagoda.runtime.entrypoints.openai.cli_args import server_config_from

    try:
        args, config = server_config_from(ns)
        return run_server(args, config)
    except (ValueError, EngineStartupError) as exc:
        print(f"pagoda: error: {exc}", file=sys.stderr)
        return 2


def _download_parser(sub) -> None:
    from pagoda.runtime.entrypoints.download import add_download_args, run_download

    p = sub.add_parser(
        "download", help="download a Hugging Face model into the local cache (before serve)"
    )
    add_download_args(p)
    p.set_defaults(func=run_download)


def _bench_parser(sub) -> None:
    from pagoda.runtime.entrypoints.bench_serve import add_bench_serve_args

    p = sub.add_parser("bench", help="benchmarks")
    bench_sub = p.add_subparsers(dest="bench_command", required=True)
    add_bench_serve_args(bench_sub.add_parser("serve", help="benchmark a running server"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagoda", description="Serve and run LLMs.")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    _serve_parser(sub)
    _download_parser(sub)
    _bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    logging.basicConfig(
        level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return ns.func(ns)
    except (InvalidRequestError, FileNotFoundError) as exc:
        print(f"pagoda: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
