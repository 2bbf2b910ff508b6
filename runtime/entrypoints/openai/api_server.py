"""The OpenAI-compatible API server process: FastAPI app + uvicorn + AsyncLLM.

Life cycle (what Kubernetes sees):
- start-up: the EngineCore process loads the model while this process loads
  the tokenizer; uvicorn listens only once both are ready, so the first 200
  on /health means the server can serve.
- SIGTERM: drain. New requests get 503 (and /health 503, so the pod leaves
  the Service), requests in flight finish, up to --drain-timeout; then the
  server stops and the process exits 0.
- the EngineCore dies: in-flight requests fail with an error, /health turns
  503, and shortly after the process exits 1 so the pod is restarted.

With --admin-port the same server also listens on the admin port (admin.py):
the adapter routes move there, behind their own key.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from dataclasses import dataclass
from types import FrameType

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.engine.async_llm import AsyncLLM
from pagoda.runtime.engine.core_client import EngineDeadError
from pagoda.runtime.engine.lora_registry import LoRARegistry
from pagoda.runtime.entrypoints.openai.admin import ByPort, build_admin_app, listen
from pagoda.runtime.entrypoints.openai.errors import (
    APIError,
    error_response,
    install_error_handlers,
)
from pagoda.runtime.entrypoints.openai.lora_file import AdaptersFileWatcher
from pagoda.runtime.entrypoints.openai.lora_routes import adapter_cards, install_lora_routes
from pagoda.runtime.entrypoints.openai.metrics import ServingMetrics
from pagoda.runtime.entrypoints.openai.middleware import ServerMiddleware, ServerState
from pagoda.runtime.entrypoints.openai.openapi import (
    COMMON_ERRORS,
    MODEL_ROUTE_ERRORS,
    install_openapi,
)
from pagoda.runtime.entrypoints.openai.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from pagoda.runtime.entrypoints.openai.serving_chat import OpenAIServingChat
from pagoda.runtime.entrypoints.openai.serving_completions import OpenAIServingCompletion
from pagoda.runtime.entrypoints.openai.serving_engine import ClientDisconnected, ServingConfig
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

logger = logging.getLogger(__name__)

# After the engine core dies, keep answering (503) this long so in-flight
# requests receive their error and probes see the failure, then exit.
_DEAD_LINGER_S = 2.0


@dataclass
class ServerConfig:
    """The server's own options (the engine's are in EngineArgs)."""

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_key: str | None = None
    max_waiting_requests: int | None = 1024
    # Larger bodies get 413 before they are parsed (None: no limit).
    max_request_body_bytes: int | None = 4 * 2**20
    drain_timeout: float = 30.0
    # No message from the engine core for this long, or one step taking this
    # long: it is hung (dead). None: never.
    engine_heartbeat_timeout: float | None = 10.0
    engine_step_timeout: float | None = 300.0
    num_threads: int | None = None
    log_level: str = "INFO"
    # A JSON list of {name, path} the server's LoRA adapters converge on.
    lora_adapters_file: str | None = None
    lora_adapters_poll_interval: float = 2.0
    # The admin listener (admin.py): None serves the adapter routes on `port`.
    admin_port: int | None = None
    admin_key: str | None = None


@dataclass
class ServerApps:
    """The public app, and the admin port's app when there is one."""

    public: FastAPI
    admin: FastAPI | None = None


def build_app(engine: AsyncLLM, config: ServerConfig, state: ServerState | None = None) -> FastAPI:
    """The public FastAPI app over a running engine."""
    return build_apps(engine, config, state).public


def build_apps(
    engine: AsyncLLM, config: ServerConfig, state: ServerState | None = None
) -> ServerApps:
    """The public app and, with `config.admin_port`, the admin app, over one engine."""
    state = state or ServerState()
    model_name = config.served_model_name or engine.args.model
    # /v1/models' `created` for the base model: when this server came up, the
    # same in every listing (OpenAI's is fixed per model; a listing-time value
    # makes clients that diff or cache the list see it change every second).
    started = int(time.time())
    serving_config = ServingConfig(model_name)
    engine.max_waiting_requests = config.max_waiting_requests
    completions = OpenAIServingCompletion(engine, serving_config)
    chat = OpenAIServingChat(engine, serving_config)
    registry = CollectorRegistry()
    metrics = ServingMetrics(model_name, engine.max_model_len, registry)
    metrics.track_pending(lambda: engine.num_pending)
    engine.stat_logger = metrics
    if engine.args.enable_lora:
        loras = LoRARegistry(engine.client.call_utility, model_name, metrics.on_lora_event)
        engine.lora_registry = loras
        metrics.max_lora = engine.args.max_loras
        metrics.lora_names = lambda lora_id: loras.names.get(lora_id, str(lora_id))
        metrics.loras_loaded.set_function(lambda: len(loras.adapters))

    app = FastAPI(title="Pagoda OpenAI-compatible server")
    app.state.server_state = state
    app.state.engine = engine
    install_error_handlers(app, metrics.on_rejected)
    install_openapi(app)
    app.add_middleware(
        ServerMiddleware,
        state=state,
        api_key=config.api_key,
        max_body_bytes=config.max_request_body_bytes,
        on_rejected=metrics.on_rejected,
    )

    @app.exception_handler(ClientDisconnected)
    async def _disconnected(request: Request, exc: ClientDisconnected):
        # Nobody reads this; 499 is nginx's "client closed request".
        return Response(status_code=499)

    def stream_of(model: type) -> dict:
        # 200: JSON, or Server-Sent Events of `model` chunks when stream is true.
        return {
            "description": "the response, or with stream=true Server-Sent Events whose "
            f"data are {model.__name__} objects, then [DONE]",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }

    @app.get(
        "/health",
        response_class=Response,
        responses={200: {"description": "ready (empty body)"}, 503: COMMON_ERRORS[503]},
    )
    async def health() -> Response:
        if engine.is_dead or state.engine_dead:
            return error_response("the engine is not running", 503)
        if state.draining:
            return error_response("the server is shutting down", 503)
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        from importlib.metadata import version as dist_version

        return {"version": dist_version("pagoda")}

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"description": "Prometheus text exposition format"}},
    )
    async def prometheus_metrics() -> Response:
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList, responses=COMMON_ERRORS)
    async def models() -> dict:
        cards = [
            ModelCard(
                id=model_name,
                created=started,
                root=engine.args.model,
                max_model_len=engine.max_model_len,
            )
        ]
        if engine.lora_registry is not None:
            cards += adapter_cards(engine.lora_registry, engine.max_model_len)
        return ModelList(data=cards).model_dump()

    admin = None
    if config.admin_port is None:
        install_lora_routes(app, engine)
    else:
        admin = build_admin_app(
            engine,
            state,
            config.admin_key,
            health=health,
            metrics=prometheus_metrics,
            models=models,
        )

    @app.post(
        "/v1/completions",
        response_model=CompletionResponse,
        responses={200: stream_of(CompletionChunk), **MODEL_ROUTE_ERRORS},
    )
    async def create_completion(body: CompletionRequest, raw: Request):
        return await completions.create_completion(body, raw)

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        responses={200: stream_of(ChatCompletionChunk), **MODEL_ROUTE_ERRORS},
    )
    async def create_chat_completion(body: ChatCompletionRequest, raw: Request):
        return await chat.create_chat_completion(body, raw)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=MODEL_ROUTE_ERRORS)
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        completions.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError("give exactly one of prompt and messages", 400, "prompt")
        # Each mode encodes as its route does (a chat prompt without the
        # tokenizer's special tokens), so the count equals usage.prompt_tokens.
        if body.messages is not None:
            text = await chat.render_prompt(
                body.messages, body.add_generation_prompt, body.chat_template_kwargs
            )
            add_special = False
        else:
            text, add_special = body.prompt, True
        if body.add_special_tokens is not None:
            add_special = body.add_special_tokens
        if engine.tokenizer is None:
            raise APIError("this model has no tokenizer", 400, "prompt")
        engine.check_prompt_length(text, "messages" if body.messages is not None else "prompt")
        tokens = await engine.tokenize(text, add_special)
        return JSONResponse(
            {"count": len(tokens), "max_model_len": engine.max_model_len, "tokens": tokens}
        )

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=MODEL_ROUTE_ERRORS)
    async def detokenize(body: DetokenizeRequest) -> JSONResponse:
        completions.check_model(body.model)
        if engine.tokenizer is None:
            raise APIError("this model has no tokenizer", 400, "tokens")
        vocab = engine.processor.vocab_size
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(f"token id {bad} is outside [0, {vocab})", 400, "tokens")
        return JSONResponse({"prompt": engine.tokenizer.decode(body.tokens)})

    return ServerApps(app, admin)


class _Server(uvicorn.Server):
    """uvicorn, with SIGTERM meaning "drain" rather than "close now".

    uvicorn's own handler closes the listening socket at once and re-raises
    the signal after shutdown (exit status -15); a rolling update needs 503s
    while in-flight requests finish, then exit 0.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float):
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout
        self._drain_task: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.should_exit:
            if self._drain_task is None:
                loop = asyncio.get_event_loop()
                loop.call_soon_threadsafe(self._start_drain)
            return
        # SIGINT: stop now; a second one forces it.
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True

    def _start_drain(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        state = self.state
        state.draining = True
        logger.info(
            "SIGTERM: draining %d request(s) in flight (up to %.0f s)",
            state.in_flight,
            self.drain_timeout,
        )
        try:
            await asyncio.wait_for(state.idle.wait(), self.drain_timeout)
            logger.info("drained; shutting down")
        except asyncio.TimeoutError:
            logger.warning(
                "drain timeout: %d request(s) still in flight are cut off", state.in_flight
            )
        self.should_exit = True


async def serve(args: EngineArgs, config: ServerConfig) -> int:
    """Run the server until SIGTERM/SIGINT (0) or the engine core dies (1)."""
    started = time.monotonic()
    engine = await AsyncLLM.create(
        args,
        num_threads=config.num_threads,
        log_level=config.log_level,
        heartbeat_timeout=config.engine_heartbeat_timeout,
        step_timeout=config.engine_step_timeout,
    )
    state = ServerState()
    exit_code = 0
    watcher = None
    sockets: list[socket.socket] = []
    try:
        apps = build_apps(engine, config, state)
        if config.lora_adapters_file:
            # Loaded before the port opens: the first 200 on /health means the
            # adapters the file lists are served (or their errors logged).
            watcher = AdaptersFileWatcher(
                config.lora_adapters_file,
                engine.lora_registry,
                config.lora_adapters_poll_interval,
            )
            await watcher.sync()
            watcher.start()
        try:
            sockets.append(listen(config.host, config.port))
            if config.admin_port is not None:
                sockets.append(listen(config.host, config.admin_port))
        except OSError as e:
            logger.error("%s", e.strerror)
            return 1
        if config.admin_port is not None and not config.admin_key:
            logger.warning(
                "the admin port %d has no --admin-key: whoever reaches it can load and "
                "unload adapters",
                config.admin_port,
            )
        app = apps.public
        if apps.admin is not None:
            app = ByPort(apps.public, {sockets[1].getsockname()[1]: apps.admin})
        uv_config = uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level.lower(),
            access_log=False,
            # Connections left after draining are closed after this long.
            timeout_graceful_shutdown=5,
        )
        server = _Server(uv_config, state, config.drain_timeout)

        def on_engine_dead(exc: EngineDeadError) -> None:
            nonlocal exit_code
            exit_code = 1
            state.engine_dead = True
            logger.error("engine core died (%s); exiting in %.0f s", exc, _DEAD_LINGER_S)
            asyncio.get_running_loop().call_later(_DEAD_LINGER_S, _stop, server)

        engine.on_dead(on_engine_dead)
        logger.info(
            "serving %s on http://%s:%d%s (ready %.1f s after launch)",
            config.served_model_name or args.model,
            config.host,
            config.port,
            "" if config.admin_port is None else f", admin on port {config.admin_port}",
            time.monotonic() - started,
        )
        # Both sockets in one server: one shutdown stops accepting on both
        # and closes them.
        await server.serve(sockets=sockets)
        if not server.started:
            exit_code = exit_code or 1
    finally:
        for sock in sockets:
            sock.close()  # uvicorn closed those it served; not those of a failed start
        if watcher is not None:
            await watcher.stop()
        await engine.shutdown()
    return exit_code


def run_server(args: EngineArgs, config: ServerConfig) -> int:
    """`serve` on uvloop where it is installed (the `serve` extra installs
    it, as vLLM does), else on asyncio's loop. Every streamed token passes
    through the event loop; on the 2-core box uvloop took the API server's
    CPU per token from 0.82-0.84 to 0.80 ms, a small gain (docs/benchmarks.md)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(args, config))
    return uvloop.run(serve(args, config))


def _stop(server: uvicorn.Server) -> None:
    server.should_exit = True
