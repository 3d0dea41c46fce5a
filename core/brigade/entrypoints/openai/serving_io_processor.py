"""``POST /pooling``: requests translated by the model's IO-processor plugin.

Mounted only when an IO processor is selected (``--io-processor-plugin`` or the model config). The
plugin turns the body into prompts and sampling parameters, every prompt runs as its own engine request,
and the plugin turns the finished outputs into the response body. The route behaves as /v1/completions
does with a list of prompts: prompts are tokenized on the tokenizer thread and length-checked before
anything is queued, a client that disconnects aborts every unfinished prompt (their KV blocks are freed),
SIGTERM drains the request or cuts it at ``--shutdown-timeout`` with a 503, and ``--api-key`` guards it
(``api_server.APIKeyMiddleware``).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from brigade.entrypoints.openai.errors import OpenAIError
from brigade.entrypoints.openai.serving_base import OpenAIServing, brief, random_request_id
from brigade.entrypoints.openai.serving_completion import MAX_SEQUENCES_PER_REQUEST
from brigade.entrypoints.openai.streaming import merge_async_iterators, run_unless_disconnected, shielded
from brigade.interfaces import RequestOutput
from brigade.plugins.io_processor import IOProcessor, IOProcessorRequest
from brigade.sampling_params import InvalidParamError, RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)

POOLING_PATH = "/pooling"


class OpenAIServingIOProcessor(OpenAIServing):
    """The /pooling handler: ``processor`` parses the body and builds the response; the rest is the server's.

    Args:
        processor: the selected IO processor (stateless; called concurrently).
        (the rest): as OpenAIServing.
    """

    def __init__(self, engine: Any, processor: IOProcessor, **kwargs: Any):
        super().__init__(engine, **kwargs)
        self.processor = processor

    async def create_pooling(self, raw_request: Request) -> Response:
        """Parse, tokenize and check every prompt, run them all, and answer the processor's body.

        Raises:
            OpenAIError: 400 (a body the processor refuses, a prompt too long, too many sequences), 503 (engine
                dead, or cut at the shutdown timeout), 500 (the request failed in the engine).
        """
        await self.engine.check_health()  # EngineDeadError: the app's 503 handler
        try:
            data = await raw_request.json()
        except ValueError:
            raise OpenAIError("the request body is not valid JSON", param=None) from None
        request = self._parse(data)
        params = msgspec.structs.replace(request.sampling_params, output_kind=RequestOutputKind.FINAL_ONLY)
        num_sequences = len(request.prompts) * params.n
        if num_sequences > MAX_SEQUENCES_PER_REQUEST:
            raise OpenAIError.bad_param(f"{len(request.prompts)} prompts x n {params.n} would start {num_sequences} "
                                        f"sequences; one request may start at most {MAX_SEQUENCES_PER_REQUEST} "
                                        "(send several requests)", "data")
        prompt_ids = [await self._prompt_ids(prompt, params) for prompt in request.prompts]
        base_id = random_request_id("pooling")
        completed, outputs = await run_unless_disconnected(
            raw_request, self._run_all(prompt_ids, params, [f"{base_id}-{i}" for i in range(len(prompt_ids))]))
        if not completed:
            return Response(status_code=499)  # the client is gone; nobody reads this
        return JSONResponse(self.processor.post_process(request, outputs))

    def _parse(self, data: Any) -> IOProcessorRequest:
        """Raises OpenAIError: 400 naming the processor's ``param`` (InvalidParamError) or ``data`` (ValueError)."""
        try:
            return self.processor.parse_request(data)
        except InvalidParamError as exc:
            raise OpenAIError.bad_param(str(exc), exc.param or "data") from None
        except ValueError as exc:
            raise OpenAIError.bad_param(str(exc), "data") from None

    async def _prompt_ids(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """One prompt's token ids, checked against the vocabulary and max_model_len.

        Raises:
            OpenAIError: 400 naming ``data``.
        """
        if isinstance(prompt, str):
            self.check_text_length(len(prompt), "data")
            token_ids = await self.tokenize(prompt, add_special_tokens=True, param="data")
        else:
            token_ids = list(prompt)
            self.check_token_ids(token_ids, "data")
        self.check_length(len(token_ids), params.max_tokens, prompt_param="data", max_tokens_param="params.max_tokens")
        return token_ids

    async def _run_all(self, prompt_ids: list[list[int]], params: SamplingParams,
                       request_ids: list[str]) -> list[RequestOutput]:
        """Every prompt's final output, in order; the unfinished ones are aborted on an error or a disconnect."""
        finals: list[RequestOutput | None] = [None] * len(prompt_ids)
        iterators = [self._generate(ids, params, rid) for ids, rid in zip(prompt_ids, request_ids)]
        try:
            async for i, output in merge_async_iterators(iterators):
                finals[i] = output
        except Exception as exc:  # becomes the client's error; nothing is swallowed
            raise self.as_openai_error(exc) from exc
        finally:
            unfinished = [rid for rid, out in zip(request_ids, finals) if out is None or not out.finished]
            if unfinished:  # an error, a disconnect or the shutdown deadline: free the engine's KV blocks now
                await shielded(lambda: self.abort(unfinished))
        return finals  # type: ignore[return-value]  # every one finished: the loop ran to its end

    def _generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str):
        if self.log_requests:
            logger.info("request %s: %d prompt tokens, params=%s", request_id, len(prompt_token_ids),
                        brief(repr(params)))
        outputs = self.engine.generate(prompt_token_ids, params, request_id)
        return outputs if self.drain is None else self.drain.guard(outputs)


def io_processor_router(serving: OpenAIServingIOProcessor) -> APIRouter:
    """A router with ``POST /pooling`` bound to ``serving``."""
    router = APIRouter()

    @router.post(POOLING_PATH)
    async def pooling(raw_request: Request) -> Response:
        return await serving.create_pooling(raw_request)

    return router
