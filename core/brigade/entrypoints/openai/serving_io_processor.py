"""``POST /pooling``: requests translated by the model's IO-processor plugin.

Mounted only when an IO processor is selected (``--io-processor-plugin`` or the model config). The
plugin turns the body into prompts and sampling parameters, every prompt runs concurrently, and the
plugin turns the finished outputs into the response body.
"""

from __future__ import annotations

import asyncio
import uuid

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from brigade.entrypoints.openai.errors import OpenAIError
from brigade.interfaces import RequestOutput
from brigade.plugins.io_processor import IOProcessor
from brigade.sampling_params import RequestOutputKind


def io_processor_router(engine, processor: IOProcessor) -> APIRouter:
    """A router with ``POST /pooling`` bound to ``processor`` and the engine client."""
    router = APIRouter()

    @router.post("/pooling")
    async def pooling(raw_request: Request) -> JSONResponse:
        try:
            data = await raw_request.json()
        except ValueError:
            raise OpenAIError("the request body is not valid JSON", param=None) from None
        try:
            request = processor.parse_request(data)
        except ValueError as exc:
            raise OpenAIError(str(exc), param="data") from None
        params = msgspec.structs.replace(request.sampling_params, output_kind=RequestOutputKind.FINAL_ONLY)
        request_id = f"pooling-{uuid.uuid4().hex}"

        async def run_one(index: int, prompt: str | list[int]) -> RequestOutput:
            final = None
            async for output in engine.generate(prompt, params, f"{request_id}-{index}"):
                final = output
            return final

        outputs = await asyncio.gather(*(run_one(i, p) for i, p in enumerate(request.prompts)))
        return JSONResponse(processor.post_process(request, list(outputs)))

    return router
