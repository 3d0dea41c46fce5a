"""AsyncMPClient: the front end's side of the ZMQ links to its EngineCore processes.

It binds one input PUSH socket per engine and one output PULL socket that every engine sends to, starts the
engines (``engine_procs.py``: one per data-parallel engine, each on its own devices), and waits for them to report
ready (or their start-up error). With data parallelism each new request goes to the least-loaded engine
(``load_balancer.py``), its aborts to the engine that owns it, and control calls to every engine.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Sequence

import msgspec
import zmq
import zmq.asyncio

from brigade.config import BrigadeConfig
from brigade.engine.engine_procs import EngineProcs, EngineStartupError, engine_label
from brigade.engine.load_balancer import LoadBalancer, merge_utility_results
from brigade.interfaces import (EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType, EngineCoreUtility,
                                UtilityMethod)

logger = logging.getLogger("brigade.engine")

__all__ = ["AsyncMPClient", "EngineDeadError", "EngineRequestError", "EngineStartupError", "UtilityCallError"]

_LIVENESS_POLL_MS = 1000
_LIVENESS_CHECK_S = 0.2  # how often the processes are checked while outputs flow (another engine may be busy)


class EngineDeadError(RuntimeError):
    """An EngineCore process died; no request can be served until restart."""


class EngineRequestError(RuntimeError):
    """One request failed inside a live engine (finish_reason "error": a plugin's logits processor raised on it);
    the message is the engine's one line naming the cause. Other requests are served as usual."""


class UtilityCallError(RuntimeError):
    """The EngineCore refused a control call (``EngineCoreOutputs.utility_error``); the message is its line."""


class AsyncMPClient:
    """Sends requests to, and receives step outputs from, the EngineCore processes (``data_parallel_size`` of
    them; one without data parallelism)."""

    def __init__(self, config: BrigadeConfig):
        self.num_engines = config.parallel_config.data_parallel_size
        self._dir = tempfile.mkdtemp(prefix="brigade-")
        self.ctx = zmq.asyncio.Context()
        self.output_address = f"ipc://{self._dir}/output"
        self.output_socket = self.ctx.socket(zmq.PULL)
        self.output_socket.bind(self.output_address)
        self.input_sockets = []
        addresses = [f"ipc://{self._dir}/input-{index}" for index in range(self.num_engines)]
        for address in addresses:
            self.input_sockets.append(self.ctx.socket(zmq.PUSH))
            self.input_sockets[-1].bind(address)
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
        try:
            self.engines = EngineProcs(config, addresses, self.output_address)
        except BaseException:
            self._close_sockets()
            raise
        self.num_blocks: list[int] = self.engines.num_blocks  # each engine's KV pool
        self.balancer = LoadBalancer(self.num_engines)
        self._call_ids = itertools.count()
        self._pending_utility: dict[int, asyncio.Future] = {}
        self.dead = False
        self.dead_reason: str | None = None  # the first failure: later ones (the engines stopped after it) are not it
        self._last_liveness_check = time.monotonic()

    async def add_request(self, request: EngineCoreRequest) -> None:
        await self.add_requests([request])

    async def add_requests(self, requests: Sequence[EngineCoreRequest]) -> None:
        """Send requests (the children of one ``n > 1`` request) to the least-loaded engine, all to the same one.
        The engine is chosen and counted before the first await, so concurrent callers see each other's sends."""
        engine = self.balancer.choose() if self.num_engines > 1 else 0
        self.balancer.add(engine, [r.request_id for r in requests])
        for request in requests:
            await self.input_sockets[engine].send_multipart([EngineCoreRequestType.ADD.value,
                                                             self.encoder.encode(request)])

    async def abort_requests(self, request_ids: list[str]) -> None:
        """Abort engine request ids, each in the engine that owns it (ids no longer in flight are dropped)."""
        if request_ids and not self.dead:
            for engine, ids in self.balancer.take_owners(request_ids).items():
                await self.input_sockets[engine].send_multipart([EngineCoreRequestType.ABORT.value,
                                                                 self.encoder.encode(ids)])

    async def call_utility(self, method: UtilityMethod, lora_request=None):
        """Call a control method in every engine, wait for all answers (decoded msgpack) and merge them
        (``merge_utility_results``). An ADD_LORA that some engine refuses is undone in the engines that took it.

        Args:
            lora_request: the ``brigade.lora.LoRARequest`` of ADD_LORA and REMOVE_LORA.
        Raises:
            UtilityCallError: an engine refused the call (its one-line reason).
            EngineDeadError: an engine died before answering.
        """
        return merge_utility_results(method, await self.call_utility_by_engine(method, lora_request))

    async def call_utility_by_engine(self, method: UtilityMethod, lora_request=None) -> list:
        """``call_utility`` without the merge: each engine's answer, in engine order. Raises as it does."""
        results = await asyncio.gather(*(self._call_engine(engine, method, lora_request)
                                         for engine in range(self.num_engines)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            if method == UtilityMethod.ADD_LORA:
                for engine, result in enumerate(results):
                    if result is True:
                        await self._call_engine(engine, UtilityMethod.REMOVE_LORA, lora_request)
            raise errors[0]
        return results

    async def _call_engine(self, engine: int, method: UtilityMethod, lora_request):
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._pending_utility[call_id] = future
        message = EngineCoreUtility(call_id, method, lora_request)
        await self.input_sockets[engine].send_multipart([EngineCoreRequestType.UTILITY.value,
                                                         self.encoder.encode(message)])
        return await future

    async def get_output(self) -> EngineCoreOutputs:
        """Wait for the next step's outputs of any engine. Returns an ``engine_error`` message (and marks the
        client dead) once any engine failed or its process is gone; the error names the engine when there are
        several. The processes are checked whenever no output came for a second, and every 0.2 s while outputs
        flow: with data parallelism the live engines keep sending while a dead one is silent."""
        while True:
            exited = self._maybe_check_liveness()
            if exited is not None and not await self.output_socket.poll(0):  # its last words first, if any
                self._mark_dead(exited)
                return EngineCoreOutputs(engine_error=exited)
            if await self.output_socket.poll(_LIVENESS_POLL_MS):
                outputs = self.decoder.decode(await self.output_socket.recv())
                if outputs.utility_call_id is not None:
                    self._answer_utility(outputs)
                    continue
                if outputs.engine_error is not None:
                    outputs.engine_error = engine_label(outputs.engine_index, self.num_engines) + outputs.engine_error
                    self._mark_dead(f"the engine failed: {outputs.engine_error}")
                    return outputs
                self.balancer.report(outputs)
                return outputs
            self._last_liveness_check = -math.inf  # a second of silence: check now

    def _maybe_check_liveness(self) -> str | None:
        """``EngineProcs.exited()``, at most every ``_LIVENESS_CHECK_S``; None between checks."""
        now = time.monotonic()
        if now - self._last_liveness_check < _LIVENESS_CHECK_S:
            return None
        self._last_liveness_check = now
        return self.engines.exited()

    def _answer_utility(self, outputs: EngineCoreOutputs) -> None:
        future = self._pending_utility.pop(outputs.utility_call_id, None)
        if future is not None and not future.done():
            if outputs.utility_error is not None:
                future.set_exception(UtilityCallError(outputs.utility_error))
            else:
                future.set_result(msgspec.msgpack.decode(outputs.utility_result))

    def exited(self) -> str | None:
        """Why the engines stopped serving (the first failure seen), else why an engine process stopped
        (``EngineProcs.exited``), or None while all run."""
        return self.dead_reason or self.engines.exited()

    def _mark_dead(self, message: str) -> None:
        self.dead = True
        self.dead_reason = self.dead_reason or message
        if self.num_engines > 1:
            logger.error("%s; stopping the other engines", message)
            self.engines.stop_all()
        for future in self._pending_utility.values():
            if not future.done():
                future.set_exception(EngineDeadError(message))
        self._pending_utility.clear()

    def _close_sockets(self) -> None:
        for sock in [*self.input_sockets, self.output_socket]:
            sock.close(linger=0)
        self.ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the engine processes and remove the socket files."""
        self.engines.shutdown(timeout)
        self._close_sockets()
