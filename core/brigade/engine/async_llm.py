"""AsyncLLM: the API server's asynchronous handle on its EngineCore processes (one per data-parallel engine).

``generate()`` is an async iterator of RequestOutputs per request. One background task reads every
step's outputs from the engine, runs the output processor, and feeds each request's queue; stat
loggers see each step there too. Closing or cancelling a ``generate()`` iterator aborts the request;
``abort()`` ends the iterator with a final output whose ``finish_reason`` is "abort". ``add_lora`` and
``remove_lora`` load and unload LoRA adapters while the engine serves (the server's runtime LoRA routes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from brigade.config import BrigadeConfig
from brigade.engine.core import prepare_config
from brigade.engine.core_client import AsyncMPClient, EngineDeadError, EngineRequestError, UtilityCallError
from brigade.engine.input_processor import InputProcessor, eos_token_id
from brigade.engine.output_processor import OutputProcessor
from brigade.interfaces import IterationStats, LoRARequest, RequestOutput, SchedulerStats, StatLoggerBase, UtilityMethod
from brigade.lora.adapter import LoRAError, LoRANameError, UnknownLoRAError
from brigade.lora.request import lora_module_requests, name_list
from brigade.sampling_params import InvalidParamError, SamplingParams
from brigade.tokenizer import get_tokenizer

logger = logging.getLogger("brigade.engine")

__all__ = ["AsyncLLM", "EngineDeadError"]


class AsyncLLM:
    """Front end of one engine: tokenization and validation here, model work in the EngineCore processes (one,
    or one per data-parallel engine behind ``AsyncMPClient``'s least-loaded routing)."""

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
        # The adapters served now, by name: the --lora-modules ones (ids 1, 2, ...), then those add_lora loads,
        # in that order, less those remove_lora unloads. The server's routes read this dict (never write it).
        self.lora_requests: dict[str, LoRARequest] = lora_module_requests(lora.lora_modules) if lora else {}
        self._next_lora_id = len(self.lora_requests) + 1  # ids are never reused: the engine core keys on them
        self._loras_loading: set[str] = set()  # names add_lora is loading now
        self.stat_loggers: list[StatLoggerBase] = []
        self.client = AsyncMPClient(config)
        self._queues: dict[str, asyncio.Queue] = {}
        self._pending_aborts: list[str] = []  # engine ids aborted this loop turn, sent together (_flush_aborts)
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

    def death_reason(self) -> str | None:
        """Why the engine cannot serve any more (it failed, or one of its processes is gone; with data
        parallelism the reason names the engine), or None while it is healthy."""
        if self.dead_error is not None:
            return self.dead_error
        exited = self.client.exited()
        if exited is not None or self.client.dead:
            return exited or "the engine failed"
        return None

    async def check_health(self) -> None:
        """Raises EngineDeadError when the engine failed or an engine process is gone."""
        reason = self.death_reason()
        if reason is not None:
            raise EngineDeadError(reason)

    async def generate(self, prompt: str | list[int], sampling_params: SamplingParams, request_id: str, *,
                       priority: int = 0, cache_salt: str | None = None,
                       lora_request: LoRARequest | None = None) -> AsyncIterator[RequestOutput]:
        """Submit a request and yield its outputs until it finishes (on the served adapter named
        ``lora_request.lora_name``, under the id it was loaded with; None: the base model).

        Raises:
            InvalidParamError: bad input (before anything is queued), or an adapter the engine does not serve.
            EngineDeadError: the engine died before or while serving the request.
            EngineRequestError: this request failed in the engine (a plugin's logits processor raised on it,
                the message names it) or in the front end (its output could not be detokenized or checked for
                stop strings); the engine goes on serving the others.
            ValueError: a request with this id is already in flight.
        """
        await self.check_health()
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in flight")
        lora = None
        if lora_request is not None:
            lora = self.lora_requests.get(lora_request.lora_name)
            if lora is None:
                raise InvalidParamError(f"LoRA adapter {lora_request.lora_name!r} is not served here; served: "
                                        f"{sorted(self.lora_requests) or 'none'}", param="model")
        self._ensure_output_task()
        # No await from the check above to the sends below: an unload after it reaches the engine after them.
        text, token_ids, children = self.input_processor.process(
            prompt, sampling_params, request_id, priority=priority, cache_salt=cache_salt,
            lora_name=lora.lora_name if lora is not None else None,
            lora_int_id=lora.lora_int_id if lora is not None else None)
        q: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = q
        self.output_processor.add_request(request_id, text, token_ids, sampling_params,
                                          [c.request_id for c in children], children[0].arrival_time,
                                          q.put_nowait)
        finished = False
        try:
            await self.client.add_requests(children)  # one engine for all of them: they share its prefix cache
            while True:
                output: RequestOutput = await q.get()
                failed = [c for c in output.outputs if c.finish_reason == "error"]
                if failed:
                    finished = output.finished  # the request's other sequences, if any still run, are aborted
                    if self.errored or not isinstance(failed[0].stop_reason, str):
                        raise EngineDeadError(self.dead_error or "the engine failed")
                    # This request failed (a plugin's logits processor raised in the engine, or detokenizing its
                    # output raised here); the engine lives.
                    raise EngineRequestError(failed[0].stop_reason)
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
        """Forget a request now; its engine ids go to the engine with the others aborted in the same loop turn,
        in one message (a dropped list of thousands of prompts is one ZMQ message, not thousands)."""
        engine_ids = self.output_processor.abort_request(request_id)
        if engine_ids and not self.errored:
            if not self._pending_aborts:
                asyncio.get_running_loop().call_soon(self._flush_aborts)
            self._pending_aborts.extend(engine_ids)

    def _flush_aborts(self) -> None:
        engine_ids, self._pending_aborts = self._pending_aborts, []
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
                self.mark_dead(outputs.engine_error)
                return
            processed = self.output_processor.process_outputs(outputs.outputs, outputs.timestamp or None)
            if processed.reqs_to_abort:
                await self.client.abort_requests(processed.reqs_to_abort)
            self._record_stats(outputs.scheduler_stats, processed.iteration_stats)

    def mark_dead(self, reason: str) -> None:
        """The engine cannot serve any more: fail every request in flight with ``reason`` (an error event on
        streams, 503 otherwise) and refuse new ones. Idempotent: the first reason stays. Called by the output
        loop, and by the server's engine watch when it sees a dead process first."""
        if self.dead_error is not None:
            return
        self.dead_error = reason
        logger.error("engine died: %s", reason)
        self.output_processor.fail_all(reason)
        # Nothing runs or waits any more: the gauges say so (else /metrics kept the last step's counts).
        for engine_index in range(self.client.num_engines):
            self._record_stats(SchedulerStats(engine_index=engine_index), IterationStats())

    def _record_stats(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats) -> None:
        for stat_logger in self.stat_loggers:
            try:
                stat_logger.record(scheduler_stats, iteration_stats)
            except Exception:
                logger.exception("stat logger %s failed", type(stat_logger).__name__)

    async def add_lora(self, lora_name: str, lora_path: str) -> LoRARequest:
        """Load a PEFT LoRA adapter into the running engine (vLLM's ``/v1/load_lora_adapter``).

        The engine's worker reads and checks it exactly as it does ``--lora-modules`` adapters
        (``lora.adapter.load_adapter``) before registering it; once this returns, requests may name it. It gets
        a fresh ``lora_int_id``, one this engine never used before.

        Args:
            lora_name: the name requests will give as ``model``.
            lora_path: a PEFT adapter folder on the engine's machine (adapter_config.json,
                adapter_model.safetensors).
        Returns:
            The LoRARequest now served (also in ``lora_requests``).
        Raises:
            LoRANameError: the name is empty, the served model's, already served or being loaded by another call.
            LoRAError: one line: LoRA is not enabled, or the adapter cannot be served (missing files, bad
                config, rank above --max-lora-rank, NaN or infinite values, wrong shapes, ...).
            EngineDeadError: the engine is gone.
        """
        await self.check_health()
        if self.config.lora_config is None:
            raise LoRAError(f"LoRA adapter {lora_name!r}: LoRA is not enabled; start the engine with --enable-lora")
        if not lora_name:
            raise LoRANameError("a LoRA adapter's name must not be empty")
        if lora_name in self.model_config.served_model_names:
            raise LoRANameError(f"LoRA adapter {lora_name!r} has the served model's name; give it another name")
        served = self.lora_requests.get(lora_name)
        if served is not None:
            raise LoRANameError(f"LoRA adapter {lora_name!r} is already loaded (from {served.lora_path}); unload "
                                "it first to load it again")
        if lora_name in self._loras_loading:
            raise LoRANameError(f"LoRA adapter {lora_name!r} is being loaded by another request")
        request = LoRARequest(lora_name, self._next_lora_id, lora_path)
        self._next_lora_id += 1
        self._loras_loading.add(lora_name)
        try:
            self._ensure_output_task()
            await self.client.call_utility(UtilityMethod.ADD_LORA, request)
        except UtilityCallError as exc:
            raise LoRAError(str(exc)) from None
        finally:
            self._loras_loading.discard(lora_name)
        self.lora_requests[lora_name] = request
        logger.info("LoRA adapter %r loaded from %s (id %d)", lora_name, lora_path, request.lora_int_id)
        return request

    async def remove_lora(self, lora_name: str, lora_int_id: int | None = None) -> LoRARequest:
        """Unload a served LoRA adapter (vLLM's ``/v1/unload_lora_adapter``); ``--lora-modules`` ones too.

        New requests naming it are refused from now on. Requests already submitted on it run to the end on
        it: the engine core drops its weights once the last of them finishes (at once when none is left).

        Args:
            lora_name: the adapter's name.
            lora_int_id: vLLM's optional field, accepted and not checked: the server assigns its adapters' ids
                itself (as vLLM, which unloads by name).
        Returns:
            The LoRARequest no longer served.
        Raises:
            UnknownLoRAError: no adapter of that name is served.
            EngineDeadError: the engine is gone.
        """
        await self.check_health()
        served = self.lora_requests.get(lora_name)
        if served is None:
            raise UnknownLoRAError(f"LoRA adapter {lora_name!r} is not loaded; loaded: "
                                   f"{name_list(self.lora_requests) or 'none'}")
        del self.lora_requests[lora_name]
        self._ensure_output_task()
        await self.client.call_utility(UtilityMethod.REMOVE_LORA, served)
        logger.info("LoRA adapter %r (id %d) unloaded; its weights go when its last request finishes", lora_name,
                    served.lora_int_id)
        return served

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix block; False while requests hold blocks."""
        self._ensure_output_task()
        return await self.client.call_utility(UtilityMethod.RESET_PREFIX_CACHE)

    async def get_kv_cache_stats(self) -> dict:
        """{"num_free_blocks", "num_total_blocks"} of the engine's KV pool (with data parallelism, summed over the
        engines' pools)."""
        self._ensure_output_task()
        return await self.client.call_utility(UtilityMethod.GET_KV_CACHE_STATS)

    async def get_kv_cache_stats_by_engine(self) -> list[dict]:
        """``get_kv_cache_stats`` of each data-parallel engine, in engine order (one entry without data
        parallelism)."""
        self._ensure_output_task()
        return await self.client.call_utility_by_engine(UtilityMethod.GET_KV_CACHE_STATS)

    def shutdown(self) -> None:
        if self._output_task is not None:
            self._output_task.cancel()
        for stat_logger in self.stat_loggers:
            stat_logger.shutdown()
        self.client.shutdown()
