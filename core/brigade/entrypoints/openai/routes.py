"""The routes of the OpenAI-compatible server: health, version and metrics; the served models; generation and
tokenization; the IO-processor's /pooling; and the endpoint plugins the operator allowed (mounted last)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from brigade.config import BrigadeConfig
from brigade.engine.async_llm import AsyncLLM, EngineDeadError
from brigade.entrypoints.openai.errors import OpenAIError
from brigade.entrypoints.openai.openapi import json_body
from brigade.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                                 TokenizeRequest)
from brigade.entrypoints.openai.responses import ModelCard, ModelList
from brigade.entrypoints.openai.request_body import parse_request
from brigade.entrypoints.openai.serving_chat import OpenAIServingChat
from brigade.entrypoints.openai.serving_completion import OpenAIServingCompletion
from brigade.entrypoints.openai.serving_tokenize import OpenAIServingTokenization
from brigade.entrypoints.openai.streaming import json_response
from brigade.interfaces import LoRARequest
from brigade.metrics.prometheus import PrometheusStatLogger
from brigade.version import __version__

logger = logging.getLogger("brigade.server")

SUPPORTED_TASKS = ("generate",)
KV_STATS_TIMEOUT_S = 5.0


def mount_system_routes(app: FastAPI, engine: AsyncLLM, stat_logger: PrometheusStatLogger) -> None:
    """GET and HEAD /health (503 once the engine died), GET /version and GET /metrics (Prometheus)."""

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
                by_engine = await asyncio.wait_for(engine.get_kv_cache_stats_by_engine(), KV_STATS_TIMEOUT_S)
            except (TimeoutError, EngineDeadError) as exc:  # serve the last values rather than fail the scrape
                logger.warning("KV cache gauges not refreshed: %s", str(exc) or type(exc).__name__)
            else:
                for engine_index, stats in enumerate(by_engine):  # each data-parallel engine's gauges
                    stat_logger.set_kv_cache_blocks(stats["num_free_blocks"], stats["num_total_blocks"], engine_index)
        body, content_type = stat_logger.render()
        return Response(content=body, media_type=content_type)


def mount_model_routes(app: FastAPI, engine: AsyncLLM, config: BrigadeConfig,
                       adapters: Mapping[str, LoRARequest]) -> None:
    """GET /v1/models and /v1/models/{id}: the served model under each of its names, and the LoRA adapters
    (``adapters``, read live)."""
    served_name = config.model_config.name
    served_names = config.model_config.served_model_names

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


def mount_generation_routes(app: FastAPI, completion: OpenAIServingCompletion, chat: OpenAIServingChat,
                            tokenization: OpenAIServingTokenization, *, tokenizer_info: bool = False) -> None:
    """POST /v1/completions, /v1/chat/completions, /tokenize and /detokenize, each body parsed by its model; with
    ``tokenizer_info`` (``--enable-tokenizer-info-endpoint``), GET /tokenizer_info too."""

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

    if tokenizer_info:
        @app.get("/tokenizer_info")
        async def get_tokenizer_info() -> Response:
            return JSONResponse(tokenization.tokenizer_info())


def mount_io_processor(app: FastAPI, engine: AsyncLLM, config: BrigadeConfig, **serving_kwargs) -> None:
    """Serve POST /pooling through the selected IO-processor plugin, if the model has one.

    ``serving_kwargs``: the OpenAIServing arguments the other routes get (tokenizer thread, drain, ...)."""
    from brigade.entrypoints.openai.serving_io_processor import OpenAIServingIOProcessor, io_processor_router
    from brigade.plugins import registries
    from brigade.plugins.io_processor import get_io_processor

    processor = get_io_processor(config.model_config, registries, engine.hf_config)
    if processor is not None:
        logger.info("IO processor %s serves POST /pooling", type(processor).__name__)
        app.include_router(io_processor_router(OpenAIServingIOProcessor(engine, processor, **serving_kwargs)))


def mount_endpoint_plugins(app: FastAPI) -> list[str]:
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
