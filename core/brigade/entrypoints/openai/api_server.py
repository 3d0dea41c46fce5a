"""The OpenAI-compatible HTTP server: a FastAPI app over an AsyncLLM, served by uvicorn.

The API server process only parses, renders chat templates, tokenizes and streams; the EngineCore runs
in its own process behind AsyncLLM, so no route ever waits on model work. Routes (``routes``; docs/server.md):
/v1/completions, /v1/chat/completions, /v1/models and /v1/models/{id}, and /health, /version, /tokenize,
/detokenize, /metrics; /tokenizer_info with ``--enable-tokenizer-info-endpoint``; /pooling with an IO processor. The API key is checked on /v1/* and /pooling. With
``--enable-lora`` and BRIGADE_ALLOW_RUNTIME_LORA_UPDATING, also vLLM's /v1/load_lora_adapter and
/v1/unload_lora_adapter (``runtime_lora``). Endpoint plugins the operator allowed
are mounted last. CORS preflights are answered with vLLM's defaults (any origin, method and header; no credentials).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import socket
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse

from brigade import envs
from brigade.config import BrigadeConfig
from brigade.engine.async_llm import AsyncLLM, EngineDeadError
from brigade.entrypoints.openai.errors import OpenAIError, install_error_handlers
from brigade.entrypoints.openai.openapi import install_request_schemas
from brigade.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                                 LoadLoRAAdapterRequest, TokenizeRequest,
                                                 UnloadLoRAAdapterRequest)
from brigade.entrypoints.openai.routes import (mount_endpoint_plugins, mount_generation_routes,
                                               mount_io_processor, mount_model_routes, mount_system_routes)
from brigade.entrypoints.openai.runtime_lora import (RUNTIME_LORA_ENV, TRUE_VALUES, mount_runtime_lora,
                                                     runtime_lora_updating)
from brigade.entrypoints.openai.generation_defaults import load_generation_defaults
from brigade.entrypoints.openai.serving_base import max_token_chars
from brigade.entrypoints.openai.serving_chat import OpenAIServingChat
from brigade.entrypoints.openai.serving_completion import OpenAIServingCompletion
from brigade.entrypoints.openai.serving_tokenize import OpenAIServingTokenization
from brigade.entrypoints.openai.shutdown import FLUSH_GRACE_S, Drain, DrainingServer
from brigade.interfaces import LoRARequest, StatLoggerBase
from brigade.metrics.log_stats import LoggingStatLogger
from brigade.metrics.prometheus import PrometheusStatLogger
from brigade.utils import freeze_gc_heap
from brigade.version import __version__

logger = logging.getLogger("brigade.server")

__all__ = ["RUNTIME_LORA_ENV", "APIKeyMiddleware", "ServerSettings", "bind_socket", "build_app",
           "runtime_lora_updating", "serve_http"]

STAT_LOG_INTERVAL_S = 10.0  # brigade serve: $BRIGADE_LOG_STATS_INTERVAL (vLLM's VLLM_LOG_STATS_INTERVAL)
KEEP_ALIVE_ENV = "BRIGADE_KEEP_ALIVE_ON_ENGINE_DEATH"  # vLLM's VLLM_KEEP_ALIVE_ON_ENGINE_DEATH
ENGINE_WATCH_INTERVAL_S = 1.0


@dataclass
class ServerSettings:
    """The HTTP side of ``brigade serve`` (the engine side is the BrigadeConfig)."""

    host: str = "0.0.0.0"
    port: int = 8000
    api_key: str | None = None
    """Checked on /v1/* and /pooling as ``Authorization: Bearer <key>``; None disables the check."""
    uvicorn_log_level: str = "info"
    log_requests: bool = False
    """Log each request's id, prompt length and sampling parameters at INFO (``--enable-log-requests``)."""
    log_stats: bool = True
    """Log vLLM's periodic stats line and call stat loggers' ``log()`` (off with ``--disable-log-stats``)."""
    log_stats_interval_s: float = STAT_LOG_INTERVAL_S
    """Seconds between those calls (``BRIGADE_LOG_STATS_INTERVAL``)."""
    shutdown_timeout_s: float = 5.0
    """How long in-flight requests may run on after SIGTERM before they are cut."""
    allowed_origins: list[str] = field(default_factory=lambda: ["*"])
    """CORS (vLLM's ``--allowed-origins``): origins whose browsers may call the API; preflights are answered."""
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    """CORS ``--allowed-methods``."""
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    """CORS ``--allowed-headers``."""
    allow_credentials: bool = False
    """CORS ``--allow-credentials``."""
    fastapi_docs: bool = True
    """Serve /docs, /redoc and /openapi.json (off with vLLM's ``--disable-fastapi-docs``)."""
    tokenizer_info_endpoint: bool = False
    """Serve GET /tokenizer_info (vLLM's ``--enable-tokenizer-info-endpoint``)."""


GUARDED_PATHS = ("/pooling",)
"""Paths outside /v1 that --api-key guards too: they run model work (docs/server.md, "API key")."""


class APIKeyMiddleware:
    """Pure ASGI middleware: 401 in OpenAI's shape for /v1/* and GUARDED_PATHS without the right Bearer key.

    Pure ASGI (not BaseHTTPMiddleware) so streaming bodies and disconnect messages pass through untouched.
    The scheme is case-insensitive (RFC 7235: ``bearer`` works, as in vLLM). The key is compared through the
    SHA-256 of both sides in constant time, so neither its bytes nor its length leak through timing.
    """

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected_digest = hashlib.sha256(api_key.encode()).digest()

    def _authorized(self, header: bytes) -> bool:
        scheme, _, token = header.strip().partition(b" ")
        digest = hashlib.sha256(token.strip()).digest()
        return hmac.compare_digest(digest, self.expected_digest) and scheme.lower() == b"bearer"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and _guarded(scope["path"]):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not self._authorized(given):
                error = OpenAIError.unauthorized()
                response = JSONResponse(error.to_response().model_dump(), status_code=error.status_code,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _guarded(path: str) -> bool:
    """Whether ``path`` needs the API key: /v1/* (as in vLLM) and GUARDED_PATHS."""
    return path.startswith("/v1") or path in GUARDED_PATHS


def _plugin_stat_loggers(config: BrigadeConfig) -> list[StatLoggerBase]:
    """Instantiate every stat logger a loaded plugin registered (``logger_cls(config)``)."""
    from brigade.plugins import registries

    return [registries.stat_loggers.create(name, config) for name in registries.stat_loggers.names()]


def build_app(engine: AsyncLLM, config: BrigadeConfig, settings: ServerSettings) -> FastAPI:
    """The FastAPI app serving ``engine``. Registers the Prometheus and plugin stat loggers on it.

    Loads the "api" plugin scope (idempotent) for stat logger and endpoint plugins.
    """
    from brigade.plugins import load_plugins

    load_plugins("api")
    stat_logger, stat_loggers = _register_stat_loggers(engine, config, settings)
    tokenizer_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="brigade-tokenizer")
    drain = Drain()
    # The served adapters by name, the engine's own dict: runtime loads and unloads show in every route.
    adapters: Mapping[str, LoRARequest] = engine.lora_requests if config.lora_config is not None else {}
    common = dict(served_model_name=config.model_config.served_model_names, tokenizer_executor=tokenizer_executor,
                  generation_defaults=load_generation_defaults(config.model_config),
                  log_requests=settings.log_requests, drain=drain,
                  scheduling_policy=config.scheduler_config.policy, max_token_chars=max_token_chars(engine.tokenizer),
                  lora_requests=adapters)
    completion = OpenAIServingCompletion(engine, **common)
    chat = OpenAIServingChat(engine, **common)
    app = _make_app(settings, _lifespan(stat_loggers, settings, tokenizer_executor))
    app.state.engine_client = engine
    app.state.api_key = settings.api_key
    app.state.config = config
    app.state.served_model_name = config.model_config.name  # the first --served-model-name: responses carry it
    app.state.served_model_names = config.model_config.served_model_names
    app.state.stat_logger = stat_logger
    app.state.drain = drain
    mount_system_routes(app, engine, stat_logger)
    mount_model_routes(app, engine, config, adapters)
    mount_generation_routes(app, completion, chat, OpenAIServingTokenization(chat),
                            tokenizer_info=settings.tokenizer_info_endpoint)
    schemas = [CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest]
    if runtime_lora_updating(config):
        mount_runtime_lora(app, engine)
        schemas += [LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest]
    mount_io_processor(app, engine, config, **common)
    mount_endpoint_plugins(app)
    install_request_schemas(app, schemas)
    return app


def _register_stat_loggers(engine: AsyncLLM, config: BrigadeConfig,
                           settings: ServerSettings) -> tuple[PrometheusStatLogger, list[StatLoggerBase]]:
    """Add the Prometheus logger (served at /metrics), the plugins' loggers and, unless ``--disable-log-stats``,
    the periodic stats line to ``engine``; returns (the Prometheus logger, all of them)."""
    stat_logger = PrometheusStatLogger(
        config.model_config.name, max_loras=config.lora_config.max_loras if config.lora_config is not None else None,
        num_speculative_tokens=(config.speculative_config.num_speculative_tokens
                                if config.speculative_config is not None else None),
        num_engines=config.parallel_config.data_parallel_size)
    stat_loggers: list[StatLoggerBase] = [stat_logger, *_plugin_stat_loggers(config)]
    if settings.log_stats:
        stat_loggers.append(LoggingStatLogger())
    for sl in stat_loggers:
        engine.add_stat_logger(sl)
    return stat_logger, stat_loggers


def _lifespan(stat_loggers: list[StatLoggerBase], settings: ServerSettings, tokenizer_executor: ThreadPoolExecutor):
    """The app's lifespan: freeze the start-up heap, log stats periodically, stop the tokenizer thread at exit."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        freeze_gc_heap()  # the server's start-up heap, out of the collector's reach (see freeze_gc_heap)
        task = (asyncio.create_task(_log_periodically(stat_loggers, settings.log_stats_interval_s))
                if settings.log_stats else None)
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
            tokenizer_executor.shutdown(wait=False)

    return lifespan


def _make_app(settings: ServerSettings, lifespan) -> FastAPI:
    """The bare app: docs as configured, OpenAI-shaped error handlers, the API key check, then CORS outermost."""
    # /docs and /redoc are FastAPI's pages, whose JavaScript and CSS come from a CDN (cdn.jsdelivr.net): blank on
    # a machine without internet access; /openapi.json is served from here. --disable-fastapi-docs drops all three.
    docs = {} if settings.fastapi_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="Brigade", version=__version__, lifespan=lifespan, **docs)
    install_error_handlers(app, EngineDeadError)
    if settings.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=settings.api_key)
    # Added last, so outermost: preflights are answered before the key check, and 401s carry CORS headers.
    app.add_middleware(CORSMiddleware, allow_origins=settings.allowed_origins,
                       allow_methods=settings.allowed_methods, allow_headers=settings.allowed_headers,
                       allow_credentials=settings.allow_credentials)
    return app


async def _log_periodically(stat_loggers: list[StatLoggerBase], interval_s: float) -> None:
    """Call each logger's ``log()`` every ``interval_s`` (for loggers that print summaries)."""
    while True:
        await asyncio.sleep(interval_s)
        for sl in stat_loggers:
            try:
                sl.log()
            except Exception:  # a plugin's logger must not stop the others; its failure is reported
                logger.exception("stat logger %s failed in log()", type(sl).__name__)


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the listening socket before the engine starts, so a busy port fails in a second, not after
    the model loaded. Raises OSError (e.g. address in use)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: accepted sockets inherit it, and asyncio sets TCP_NODELAY on a transport only when
    # the socket says it is TCP. Without it every response on a kept-alive connection waits for a delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


async def _stop_when_engine_dies(engine: AsyncLLM, server: uvicorn.Server) -> str | None:
    """Watch the engine every ENGINE_WATCH_INTERVAL_S; once it is dead (its process gone, or it reported a
    failure), log why and make ``server`` shut down, as vLLM's server does on EngineDeadError: nothing restarts
    the engine in-process, so a server answering 503 forever would only hide the failure from the supervisor
    (systemd, Kubernetes) that can restart it. Returns the reason, or None if the server stopped first."""
    while not server.should_exit:
        await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
        reason = engine.death_reason()
        if reason is not None:
            engine.mark_dead(reason)  # requests in flight fail with the cause, not with the shutdown's cut
            logger.error("the engine died (%s); shutting the API server down so that its supervisor can restart "
                         "it (%s=1 keeps it up, answering 503)", reason, KEEP_ALIVE_ENV)
            server.should_exit = True
            return reason
    return None


async def serve_http(config: BrigadeConfig, settings: ServerSettings, sock: socket.socket) -> None:
    """Start the engine, serve until SIGINT/SIGTERM or until the engine dies, then shut the engine down.

    Raises:
        EngineDeadError: the server stopped because the engine died (unless BRIGADE_KEEP_ALIVE_ON_ENGINE_DEATH
            is 1/true/yes/on, which keeps it serving 503s instead).
    """
    engine = AsyncLLM.from_config(config)
    try:
        app = build_app(engine, config, settings)
        # In-flight requests get --shutdown-timeout after SIGTERM (the Drain cuts them cleanly then);
        # uvicorn waits a little longer so the cut requests can send their last bytes.
        uv_config = uvicorn.Config(app, log_level=settings.uvicorn_log_level,
                                   timeout_graceful_shutdown=settings.shutdown_timeout_s + FLUSH_GRACE_S,
                                   lifespan="on")
        server = DrainingServer(uv_config, app.state.drain, settings.shutdown_timeout_s)
        port = sock.getsockname()[1]  # the port the system chose for --port 0
        url_host = f"[{settings.host}]" if ":" in settings.host else settings.host
        logger.info("serving %s on http://%s:%d", config.model_config.name, url_host, port)
        keep_alive = (envs.VARIABLES[KEEP_ALIVE_ENV].raw() or "").strip().lower() in TRUE_VALUES
        watch = None if keep_alive else asyncio.create_task(_stop_when_engine_dies(engine, server))
        await server.serve(sockets=[sock])
        if watch is not None:
            reason = watch.result() if watch.done() else None  # None: stopped by a signal, not by the watch
            watch.cancel()
            if reason is not None:
                raise EngineDeadError(f"the engine died ({reason}); the server shut down")
    finally:
        engine.shutdown()
