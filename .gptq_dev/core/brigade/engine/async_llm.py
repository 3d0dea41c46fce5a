"""AsyncLLM: the API server's asynchronous handle on an EngineCore process (book ch. 3).

``generate()`` is an async iterator of RequestOutputs per request. One background task reads every
step's outputs from the engine, runs the output processor, and feeds each request's queue; stat
loggers see each step there too. Closing or cancelling a ``generate()`` iterator aborts the request;
``abort()`` ends the iterator with a final output whose ``finish_reason`` is "abort".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from brigade.config import BrigadeConfig
from brigade.engine.core import prepare_config
from brigade.engine.core_client import AsyncMPClient, EngineDeadError
from brigade.engine.input_processor import InputProcessor, eos_token_id
from brigade.engine.messages import UtilityMethod
from brigade.engine.output_processor import OutputProcessor
from brigade.lora.request import LoRARequest
from brigade.metrics.stats import StatLoggerBase
from brigade.outputs import RequestOutput
from brigade.sampling_params import InvalidParamError, SamplingParams
from brigade.tokenizer import get_tokenizer

logger = logging.getLogger("brigade.engine")

__all__ = ["AsyncLLM", "EngineDeadError"]


class AsyncLLM:
    """Front end of one engine: tokenization and validation here, model work in the EngineCore process."""

    def __init__(self, config: BrigadeConfig):
        self.config = config
        self.hf_config = prepare_config(config)
        self.model_config = config.model_config
        self.max_model_len: int = config.model_config.max_model_len
        self.tokenizer = get_tokenizer(config.model_config)
        self.input_processor = InputProcessor(self.tokenizer, self.max_model_len, self.hf_config.vocab_size,
                                              eos_token_id(self.hf_config))
        self.output_processor = OutputProcessor(self.tokenizer)
        lora = config.lora_config
        self.lora_modules: dict[str, str] = dict(lora.lora_modules) if lora is not None else {}  # name -> path
        self.stat_loggers: list[StatLoggerBase] = []
        self.client = AsyncMPClient(config)
        self._queues: dict[str, asyncio.Queue] = {}
        self._output_task: asyncio.Task | None = None
        self.dead_error: str | None = None

    @classmethod
    def from_config(cls, config: BrigadeConfig) -> AsyncLLM:
        """Start the EngineCore process and return its front end (blocks until the engine is ready)."""
        return cls(config)

    @property
    def errored(self) -> bool:
        return self.dead_error is not None or self.client.dead

    def add_stat_logger(self, stat_logger: StatLoggerBase) -> None:
        self.stat_loggers.append(stat_logger)

    async def check_health(self) -> None:
        """Raises EngineDeadError when the engine process is gone."""
        if self.errored or not self.client.proc.is_alive():
            raise EngineDeadError(self.dead_error or "the engine process is not running")

    async def generate(self, prompt: str | list[int], sampling_params: SamplingParams, request_id: str, *,
                       priority: int = 0, cache_salt: str | None = None,
                       lora_request: LoRARequest | None = None) -> AsyncIterator[RequestOutput]:
        """Submit a request and yield its outputs until it finishes (on ``lora_request``'s adapter, one of
        ``--lora-modules``; None: the base model).

        Raises:
            InvalidParamError: bad input (before anything is queued), or an adapter the engine does not serve.
            EngineDeadError: the engine died before or while serving the request.
            ValueError: a request with this id is already in flight.
        """
        await self.check_health()
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in flight")
        lora_name = None
        if lora_request is not None:
            lora_name = lora_request.lora_name
            if lora_name not in self.lora_modules:
                raise InvalidParamError(f"LoRA adapter {lora_name!r} is not served here; served: "
                                        f"{sorted(self.lora_modules) or 'none'}", param="model")
        self._ensure_output_task()
        text, token_ids, children = self.input_processor.process(prompt, sampling_params, request_id,
                                                                 priority=priority, cache_salt=cache_salt,
                                                                 lora_name=lora_name)
        q: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = q
        self.output_processor.add_request(request_id, text, token_ids, sampling_params,
                                          [c.request_id for c in children], children[0].arrival_time,
                                          q.put_nowait)
        finished = False
        try:
            for child in children:
                await self.client.add_request(child)
            while True:
                output: RequestOutput = await q.get()
                if any(c.finish_reason == "error" for c in output.outputs):
                    finished = True
                    raise EngineDeadError(self.dead_error or "the engine failed")
                finished = output.finished
                yield output
                if finished:
                    # With DELTA and n > 1 every sequence's output of the last step reports the parent
                    # finished; the ones after the first are already queued and must not be dropped.
                    while not q.empty():
                        yield q.get_nowait()
                    break
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self._abort_nowait(request_id)

    def _abort_nowait(self, request_id: str) -> None:
        engine_ids = self.output_processor.abort_request(request_id)
        if engine_ids and not self.errored:
            asyncio.get_running_loop().create_task(self.client.abort_requests(engine_ids))

    async def abort(self, request_id: str) -> None:
        """Abort a request and free its KV blocks in the engine.

        A generate() iterator still serving the request yields one last RequestOutput, with ``finished``
        True and ``finish_reason`` "abort" on every sequence that was still running, and then ends (as
        vLLM's does). An unknown or already finished request id is ignored.
        """
        await self.client.abort_requests(self.output_processor.abort_request(request_id, notify=True))

    def _ensure_output_task(self) -> None:
        if self._output_task is None or self._output_task.done():
            self._output_task = asyncio.get_running_loop().create_task(self._output_loop())

    async def _output_loop(self) -> None:
        try:
            await self._process_outputs_forever()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not leave requests hanging
            logger.exception("the output loop failed")
            self.dead_error = f"the front end's output loop failed: {type(exc).__name__}: {exc}"
            self.output_processor.fail_all(self.dead_error)

    async def _process_outputs_forever(self) -> None:
        while True:
            outputs = await self.client.get_output()
            if outputs.engine_error is not None:
                self.dead_error = outputs.engine_error
                logger.error("engine died: %s", outputs.engine_error)
                self.output_processor.fail_all(outputs.engine_error)
                return
            processed = self.output_processor.process_outputs(outputs.outputs, outputs.timestamp or None)
            if processed.reqs_to_abort:
                await self.client.abort_requests(processed.reqs_to_abort)
            for stat_logger in self.stat_loggers:
                try:
                    stat_logger.record(outputs.scheduler_stats, processed.iteration_stats)
                except Exception:
                    logger.exception("stat logger %s failed", type(stat_logger).__name__)

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix block; False while requests hold blocks."""
        self._ensure_output_task()
        return await self.client.call_utility(UtilityMethod.RESET_PREFIX_CACHE)

    async def get_kv_cache_stats(self) -> dict:
        """{"num_free_blocks", "num_total_blocks"} of the engine's KV pool."""
        self._ensure_output_task()
        return await self.client.call_utility(UtilityMethod.GET_KV_CACHE_STATS)

    def shutdown(self) -> None:
        if self._output_task is not None:
            self._output_task.cancel()
        for stat_logger in self.stat_loggers:
            stat_logger.shutdown()
        self.client.shutdown()
