"""vLLM's runtime LoRA routes, POST /v1/load_lora_adapter and /v1/unload_lora_adapter, and the switch that
mounts them (BRIGADE_ALLOW_RUNTIME_LORA_UPDATING with ``--enable-lora``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from brigade import envs
from brigade.config import BrigadeConfig
from brigade.engine.async_llm import AsyncLLM
from brigade.entrypoints.openai.errors import OpenAIError
from brigade.entrypoints.openai.openapi import json_body
from brigade.entrypoints.openai.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from brigade.entrypoints.openai.request_body import parse_request
from brigade.lora.adapter import LoRAError, LoRANameError, UnknownLoRAError

logger = logging.getLogger("brigade.server")

RUNTIME_LORA_ENV = "BRIGADE_ALLOW_RUNTIME_LORA_UPDATING"
TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("", "0", "false", "no", "off")


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
    if value in FALSE_VALUES:
        return False
    if value not in TRUE_VALUES:
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


def mount_runtime_lora(app: FastAPI, engine: AsyncLLM) -> None:
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
