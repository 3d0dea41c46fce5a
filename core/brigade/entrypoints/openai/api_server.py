"""The OpenAI-compatible HTTP server: a FastAPI app over an AsyncLLM, served by uvicorn (book ch. 3).

The API server process only parses, renders chat templates, tokenizes and streams; the EngineCore runs
in its own process behind AsyncLLM, so no route ever waits on model work (DESIGN.md). Routes follow
API.md: /v1/completions, /v1/chat/completions, /v1/models and /v1/models/{id} (API key checked on /v1/*), and /health,
/version, /tokenize, /detokenize, /metrics. With ``--enable-lora`` and BRIGADE_ALLOW_RUNTIME_LORA_UPDATING, also
vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter. Endpoint plugins the operator allowed are mounted
last. CORS preflights are answered with vLLM's defaults (any origin, method and header; no credentials).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from brigade import envs
from brigade.config import BrigadeConfig
from brigade.engine.async_llm import AsyncLLM, EngineDeadError
from brigade.entrypoints.openai.errors import OpenAIError, install_error_handlers
from brigade.entrypoints.openai.openapi import install_request_schemas, json_body
from brigade.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                                 LoadLoRAAdapterRequest, TokenizeRequest,
                                                 UnloadLoRAAdapterRequest)
from brigade.entrypoints.openai.responses import ModelCard, ModelList
from brigade.entrypoints.openai.serving_base import load_generation_defaults, max_token_chars, parse_request
from brigade.entrypoints.openai.serving_chat import OpenAIServingChat
from brigade.entrypoints.openai.serving_completion import OpenAIServingCompletion
from brigade.entrypoints.openai.serving_tokenize import OpenAIServingTokenization
from brigade.entrypoints.openai.shutdown import (FLUSH_GRACE_S, Drain, DrainingServer,
                                                 quiet_signals_after_serve)
from brigade.entrypoints.openai.streaming import json_response
from brigade.lora.adapter import LoRAError, LoRANameError, UnknownLoRAError
from brigade.lora.request import LoRARequest
from brigade.metrics.log_stats import LoggingStatLogger
from brigade.metrics.prometheus import PrometheusStatLogger
from brigade.metrics.stats import StatLoggerBase
from brigade.utils import freeze_gc_heap
from brigade.version import __version__

logger = logging.getLogger("brigade.server")

SUPPORTED_TASKS = ("generate",)
STAT_LOG_INTERVAL_S = 10.0  # brigade serve: $BRIGADE_LOG_STATS_INTERVAL (vLLM's VLLM_LOG_STATS_INTERVAL)
KV_STATS_TIMEOUT_S = 5.0
RUNTIME_LORA_ENV = "BRIGADE_ALLOW_RUNTIME_LORA_UPDATING"
KEEP_ALIVE_ENV = "BRIGADE_KEEP_ALIVE_ON_ENGINE_DEATH"  # vLLM's VLLM_KEEP_ALIVE_ON_ENGINE_DEATH
ENGINE_WATCH_INTERVAL_S = 1.0
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass
class ServerSettings:
    """The HTTP side of ``brigade serve`` (the engine side is the BrigadeConfig)."""

    host: str = "0.0.0.0"
    port: int = 8000
    api_key: str | None = None
    """Checked on /v1/* as ``Authorization: Bearer <key>``; None disables the check."""
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


class APIKeyMiddleware:
    """Pure ASGI middleware: 401 in OpenAI's shape for /v1/* without the right Bearer key.

    Pure ASGI (not BaseHTTPMiddleware) so streaming bodies and disconnect messages pass through untouched.
    The comparison is constant-time.
    """

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = OpenAIError.unauthorized()
                response = JSONResponse(error.to_response().model_dump(), status_code=error.status_code,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _plugin_stat_loggers(config: BrigadeConfig) -> list[StatLoggerBase]:
    """Instantiate every stat logger a loaded plugin registered (``logger_cls(config)``)."""
    from brigade.plugins import registries

    return [registries.stat_loggers.create(name, config) for name in registries.stat_loggers.names()]


def _mount_endpoint_plugins(app: FastAPI) -> list[str]:
    """Include the routers of the endpoint plugins the operator allowed (BRIGADE_ENDPOINT_PLUGINS).

    Each factory gets ``app.state`` (``engine_client``, ``api_key``, ...). A factory that fails is fatal:
    the operator named the plugin, so serving without it would be silent degradation. So is a route (method and
    path) that the server or an earlier plugin already serves: Starlette would route it to the first one, and the
    plugin's route would be silently shadowed.
    """
    from brigade.plugins import PluginLoadError, registries, select_endpoints

    owners = {key: "the server" for route in app.routes for key in _route_keys(route)}
    mounted = []
    for registration in select_endpoints(SUPPORTED_TASKS):
        router = registries.endpoints.create(registration.name, app.state)
        described = f"endpoint {registration.name!r} from {registration.source.describe()}"
        if not isinstance(router, APIRouter):
            raise PluginLoadError(f"{described} returned {type(router).__name__}, not a fastapi.APIRouter")
        for route in router.routes:
            for method, path in _route_keys(route):
                owner = owners.get((method, path))
                if owner is not None:
                    raise PluginLoadError(f"{described} routes {method} {path}, which {owner} already serves; "
                                          "an endpoint plugin may only add new routes")
        for route in router.routes:
            owners.update(dict.fromkeys(_route_keys(route), described))
        app.include_router(router)
        mounted.append(registration.name)
        logger.info("mounted endpoint plugin %r (%s)", registration.name, registration.source.describe())
    return mounted


def _route_keys(route) -> list[tuple[str, str]]:
    """(method, path) pairs a route answers (websocket routes: ("WEBSOCKET", path); mounts: none)."""
    path = getattr(route, "path", None)
    if path is None:
        return []
    methods = getattr(route, "methods", None)
    if methods is None:
        return [("WEBSOCKET", path)] if type(route).__name__.endswith("WebSocketRoute") else []
    return [(method, path) for method in sorted(methods)]


def build_app(engine: AsyncLLM, config: BrigadeConfig, settings: ServerSettings) -> FastAPI:
    """The FastAPI app serving ``engine``. Registers the Prometheus and plugin stat loggers on it.

    Loads the "api" plugin scope (idempotent) for stat logger and endpoint plugins.
    """
    from brigade.plugins import load_plugins

    load_plugins("api")
    served_name = config.model_config.name  # the first --served-model-name: what responses and metrics carry
    served_names = config.model_config.served_model_names
    stat_logger = PrometheusStatLogger(
        served_name, max_loras=config.lora_config.max_loras if config.lora_config is not None else None,
        num_speculative_tokens=(config.speculative_config.num_speculative_tokens
                                if config.speculative_config is not None else None))
    stat_loggers: list[StatLoggerBase] = [stat_logger, *_plugin_stat_loggers(config)]
    if settings.log_stats:
        stat_loggers.append(LoggingStatLogger())
    for sl in stat_loggers:
        engine.add_stat_logger(sl)
    tokenizer_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="brigade-tokenizer")
    drain = Drain()
    # The served adapters by name, the engine's own dict: runtime loads and unloads show in every route.
    adapters: Mapping[str, LoRARequest] = engine.lora_requests if config.lora_config is not None else {}
    common = dict(served_model_name=served_names, tokenizer_executor=tokenizer_executor,
                  generation_defaults=load_generation_defaults(config.model_config),
                  log_requests=settings.log_requests, drain=drain,
                  scheduling_policy=config.scheduler_config.policy, max_token_chars=max_token_chars(engine.tokenizer),
                  lora_requests=adapters)
    completion = OpenAIServingCompletion(engine, **common)
    chat = OpenAIServingChat(engine, **common)
    tokenization = OpenAIServingTokenization(chat)

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

    # /docs and /redoc are FastAPI's pages, whose JavaScript and CSS come from a CDN (cdn.jsdelivr.net): blank on
    # a machine without internet access; /openapi.json is served from here. --disable-fastapi-docs drops all three.
    docs = {} if settings.fastapi_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="Brigade", version=__version__, lifespan=lifespan, **docs)
    app.state.engine_client = engine
    app.state.api_key = settings.api_key
    app.state.config = config
    app.state.served_model_name = served_name
    app.state.served_model_names = served_names
    app.state.stat_logger = stat_logger
    app.state.drain = drain
    install_error_handlers(app, EngineDeadError)
    if settings.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=settings.api_key)
    # Added last, so outermost: preflights are answered before the key check, and 401s carry CORS headers.
    app.add_middleware(CORSMiddleware, allow_origins=settings.allowed_origins,
                       allow_methods=settings.allowed_methods, allow_headers=settings.allowed_headers,
                       allow_credentials=settings.allow_credentials)

    # HEAD for load balancers' probes; its own operation id (one route for both gave the two operations the same
    # id, and FastAPI warned "Duplicate Operation ID" each time it built /openapi.json).
    @app.get("/health")
    @app.head("/health", operation_id="health_health_head")
    async def health() -> Response:
        try:
            await engine.check_health()
        except EngineDeadError as exc:
            return JSONResponse(OpenAIError.engine_dead(str(exc)).to_response().model_dump(), status_code=503)
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        # The gauges come from the last step; when the engine is idle no step runs, so ask it directly.
        if not engine.errored:
            try:
                stats = await asyncio.wait_for(engine.get_kv_cache_stats(), KV_STATS_TIMEOUT_S)
            except (TimeoutError, EngineDeadError) as exc:  # serve the last values rather than fail the scrape
                logger.warning("KV cache gauges not refreshed: %s", str(exc) or type(exc).__name__)
            else:
                stat_logger.set_kv_cache_blocks(stats["num_free_blocks"], stats["num_total_blocks"])
        body, content_type = stat_logger.render()
        return Response(content=body, media_type=content_type)

    def model_cards() -> dict[str, ModelCard]:
        """The served model under each of its names, then each LoRA adapter as vLLM lists it: ``root`` its path,
        ``parent`` the model's first name (``--lora-modules`` first, then those loaded at runtime, in load
        order)."""
        cards = {name: ModelCard(id=name, root=config.model_config.model, max_model_len=engine.max_model_len)
                 for name in served_names}
        for name, lora in list(adapters.items()):
            cards[name] = ModelCard(id=name, root=lora.lora_path, parent=served_name,
                                    max_model_len=engine.max_model_len)
        return cards

    @app.get("/v1/models")
    async def models() -> ModelList:
        """The served models; 503 once the engine died, as every /v1 route (nothing it lists can be served)."""
        await engine.check_health()  # EngineDeadError: the 503 handler
        return ModelList(data=list(model_cards().values()))

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> ModelCard:
        """One model or adapter by id (the openai client's ``models.retrieve``); 404 ``model_not_found`` otherwise;
        503 once the engine died."""
        await engine.check_health()
        card = model_cards().get(model_id)
        if card is None:
            raise OpenAIError.model_not_found(model_id, served_names, list(adapters))
        return card

    @app.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def completions(raw_request: Request) -> Response:
        return await completion.create_completion(await parse_request(raw_request, CompletionRequest), raw_request)

    @app.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
    async def chat_completions(raw_request: Request) -> Response:
        return await chat.create_chat_completion(await parse_request(raw_request, ChatCompletionRequest),
                                                 raw_request)

    @app.post("/tokenize", openapi_extra=json_body(TokenizeRequest))
    async def tokenize(raw_request: Request) -> Response:
        result = await tokenization.tokenize(await parse_request(raw_request, TokenizeRequest))
        return json_response(result)

    @app.post("/detokenize", openapi_extra=json_body(DetokenizeRequest))
    async def detokenize(raw_request: Request) -> Response:
        result = await tokenization.detokenize(await parse_request(raw_request, DetokenizeRequest))
        return json_response(result)

    schemas = [CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest]
    if runtime_lora_updating(config):
        _mount_runtime_lora(app, engine)
        schemas += [LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest]
    _mount_io_processor(app, engine, config)
    _mount_endpoint_plugins(app)
    install_request_schemas(app, schemas)
    return app


def runtime_lora_updating(config: BrigadeConfig, env: Mapping[str, str] | None = None) -> bool:
    """Whether the server mounts POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's
    VLLM_ALLOW_RUNTIME_LORA_UPDATING).

    True when BRIGADE_ALLOW_RUNTIME_LORA_UPDATING (in ``env``, default os.environ) is 1, true, yes or on (any
    case) and the server runs with ``--enable-lora``, which it then logs as a WARNING: anyone who may call the API
    can make the server read adapter folders from its file system. Set without ``--enable-lora``: one WARNING
    saying so, and False (the server starts as it would without the variable; vLLM does not refuse to start
    either). Unset, or "", 0, false, no, off: False, silently. Any other value: one WARNING, and False.
    """
    raw = envs.VARIABLES[RUNTIME_LORA_ENV].raw(env)
    value = (raw or "").strip().lower()
    if value in _FALSE:
        return False
    if value not in _TRUE:
        logger.warning("%s=%r is not a boolean; runtime LoRA loading stays off (use 1 or true to turn it on)",
                       RUNTIME_LORA_ENV, raw)
        return False
    if config.lora_config is None:
        logger.warning("%s is set but the server runs without --enable-lora, so /v1/load_lora_adapter and "
                       "/v1/unload_lora_adapter are not served; start with --enable-lora (and --max-loras, "
                       "--max-lora-rank) to load adapters at runtime", RUNTIME_LORA_ENV)
        return False
    logger.warning("%s: POST /v1/load_lora_adapter and /v1/unload_lora_adapter are served; whoever may call this "
                   "API can make the server read adapter folders from its file system", RUNTIME_LORA_ENV)
    return True


def _mount_runtime_lora(app: FastAPI, engine: AsyncLLM) -> None:
    """vLLM's runtime LoRA routes (under /v1, so the API key applies), over ``AsyncLLM.add_lora`` and
    ``remove_lora``.

    POST /v1/load_lora_adapter ``{"lora_name": str, "lora_path": str}``: 200 with the text ``Success: LoRA adapter
    'NAME' added successfully.``; 400 (OpenAI's error shape) for an empty or missing field, a name already served
    (or being loaded, or the served model's; param ``lora_name``), and an adapter that cannot be served (bad
    path, bad config, rank above --max-lora-rank, NaN or infinite values, wrong shapes; param ``lora_path``, the
    message naming the problem). POST /v1/unload_lora_adapter ``{"lora_name": str, "lora_int_id": int
    (optional)}``: 200 with ``Success: LoRA adapter 'NAME' removed successfully.``, 404 for an adapter not served.
    503 while the engine is dead.
    """

    @app.post("/v1/load_lora_adapter", openapi_extra=json_body(LoadLoRAAdapterRequest))
    async def load_lora_adapter(raw_request: Request) -> Response:
        body = await parse_request(raw_request, LoadLoRAAdapterRequest)
        if body.model_extra:
            if body.model_extra.get("load_inplace"):
                raise OpenAIError("load_inplace is not supported by this server: unload the adapter, then load it "
                                  "again", param="load_inplace", code="not_supported")
            logger.warning("ignoring unknown request fields: %s", sorted(body.model_extra))
        try:
            await engine.add_lora(body.lora_name, body.lora_path)
        except LoRANameError as exc:
            raise OpenAIError.bad_param(str(exc), "lora_name") from None
        except LoRAError as exc:
            raise OpenAIError.bad_param(str(exc), "lora_path") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", openapi_extra=json_body(UnloadLoRAAdapterRequest))
    async def unload_lora_adapter(raw_request: Request) -> Response:
        body = await parse_request(raw_request, UnloadLoRAAdapterRequest)
        if body.model_extra:
            logger.warning("ignoring unknown request fields: %s", sorted(body.model_extra))
        try:
            await engine.remove_lora(body.lora_name, body.lora_int_id)
        except UnknownLoRAError as exc:
            raise OpenAIError(str(exc), status_code=404, type="not_found_error", param="lora_name",
                              code="lora_not_found") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _mount_io_processor(app: FastAPI, engine: AsyncLLM, config: BrigadeConfig) -> None:
    """Serve POST /pooling through the selected IO-processor plugin, if the model has one."""
    from brigade.entrypoints.openai.serving_io_processor import io_processor_router
    from brigade.plugins import registries
    from brigade.plugins.io_processor import get_io_processor

    processor = get_io_processor(config.model_config, registries, engine.hf_config)
    if processor is not None:
        logger.info("IO processor %s serves POST /pooling", type(processor).__name__)
        app.include_router(io_processor_router(engine, processor))


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
    sock = socket.socket(family, socket.SOCK_STREAM)
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
        if engine.errored or not engine.client.proc.is_alive():
            reason = engine.dead_error or f"the engine process exited with code {engine.client.proc.exitcode}"
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
        quiet_signals_after_serve()
        logger.info("serving %s on http://%s:%d", config.model_config.name, settings.host, settings.port)
        keep_alive = (envs.VARIABLES[KEEP_ALIVE_ENV].raw() or "").strip().lower() in _TRUE
        watch = None if keep_alive else asyncio.create_task(_stop_when_engine_dies(engine, server))
        await server.serve(sockets=[sock])
        if watch is not None:
            reason = watch.result() if watch.done() else None  # None: stopped by a signal, not by the watch
            watch.cancel()
            if reason is not None:
                raise EngineDeadError(f"the engine died ({reason}); the server shut down")
    finally:
        engine.shutdown()
