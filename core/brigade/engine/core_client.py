"""AsyncMPClient: the front end's side of the ZMQ link to an EngineCore process.

It binds an input PUSH socket and an output PULL socket in a private temporary directory, spawns the
EngineCore process, and waits for it to report ready (or its start-up error).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import shutil
import tempfile

import msgspec
import zmq
import zmq.asyncio

from brigade import envs
from brigade.config import BrigadeConfig
from brigade.engine.core_proc import run_engine_core
from brigade.interfaces import (EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType, EngineCoreUtility,
                                UtilityMethod)

logger = logging.getLogger("brigade.engine")

_LIVENESS_POLL_MS = 1000


class EngineDeadError(RuntimeError):
    """The EngineCore process died; no request can be served until restart."""


class EngineRequestError(RuntimeError):
    """One request failed inside a live engine (finish_reason "error": a plugin's logits processor raised on it);
    the message is the engine's one line naming the cause. Other requests are served as usual."""


class EngineStartupError(RuntimeError):
    """The EngineCore process failed while starting; the message carries its error."""


class UtilityCallError(RuntimeError):
    """The EngineCore refused a control call (``EngineCoreOutputs.utility_error``); the message is its line."""


class AsyncMPClient:
    """Sends requests to, and receives step outputs from, one EngineCore process."""

    def __init__(self, config: BrigadeConfig):
        self._dir = tempfile.mkdtemp(prefix="brigade-")
        self.input_address = f"ipc://{self._dir}/input"
        self.output_address = f"ipc://{self._dir}/output"
        self.ctx = zmq.asyncio.Context()
        self.input_socket = self.ctx.socket(zmq.PUSH)
        self.input_socket.bind(self.input_address)
        self.output_socket = self.ctx.socket(zmq.PULL)
        self.output_socket.bind(self.output_address)
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
        mp = multiprocessing.get_context("spawn")
        parent_conn, child_conn = mp.Pipe(duplex=False)
        self.proc = mp.Process(target=run_engine_core, name="BrigadeEngineCore", daemon=True,
                               args=(config, self.input_address, self.output_address, child_conn))
        self.proc.start()
        child_conn.close()
        timeout_s = envs.BRIGADE_ENGINE_STARTUP_TIMEOUT
        if not parent_conn.poll(timeout_s):
            self.shutdown()
            raise EngineStartupError(f"the engine did not start within {timeout_s:.0f} s")
        try:
            info = parent_conn.recv()
        except EOFError:
            self.shutdown()
            raise EngineStartupError(f"the engine process exited during start-up (code {self.proc.exitcode})") \
                from None
        if info["status"] != "ready":
            self.shutdown()
            logger.debug("engine start-up traceback:\n%s", info["traceback"])
            raise EngineStartupError(f"the engine failed to start: {info['error']}")
        self.num_blocks: int = info["num_blocks"]
        self._call_ids = itertools.count()
        self._pending_utility: dict[int, asyncio.Future] = {}
        self.dead = False

    async def add_request(self, request: EngineCoreRequest) -> None:
        await self.input_socket.send_multipart([EngineCoreRequestType.ADD.value, self.encoder.encode(request)])

    async def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and not self.dead:
            await self.input_socket.send_multipart([EngineCoreRequestType.ABORT.value,
                                                    self.encoder.encode(request_ids)])

    async def call_utility(self, method: UtilityMethod, lora_request=None):
        """Call a control method in the engine and wait for its answer (decoded msgpack).

        Args:
            lora_request: the ``brigade.lora.LoRARequest`` of ADD_LORA and REMOVE_LORA.
        Raises:
            UtilityCallError: the engine refused the call (its one-line reason).
            EngineDeadError: the engine died before answering.
        """
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._pending_utility[call_id] = future
        message = EngineCoreUtility(call_id, method, lora_request)
        await self.input_socket.send_multipart([EngineCoreRequestType.UTILITY.value, self.encoder.encode(message)])
        return await future

    async def get_output(self) -> EngineCoreOutputs:
        """Wait for the next step's outputs. Raises EngineDeadError if the process is gone."""
        while True:
            if await self.output_socket.poll(_LIVENESS_POLL_MS):
                outputs = self.decoder.decode(await self.output_socket.recv())
                if outputs.utility_call_id is not None:
                    future = self._pending_utility.pop(outputs.utility_call_id, None)
                    if future is not None and not future.done():
                        if outputs.utility_error is not None:
                            future.set_exception(UtilityCallError(outputs.utility_error))
                        else:
                            future.set_result(msgspec.msgpack.decode(outputs.utility_result))
                    continue
                if outputs.engine_error is not None:
                    self._mark_dead(f"the engine failed: {outputs.engine_error}")
                return outputs
            if not self.proc.is_alive():
                self._mark_dead(f"the engine process died (exit code {self.proc.exitcode})")
                return EngineCoreOutputs(engine_error=f"engine process exited with code {self.proc.exitcode}")

    def _mark_dead(self, message: str) -> None:
        self.dead = True
        for future in self._pending_utility.values():
            if not future.done():
                future.set_exception(EngineDeadError(message))
        self._pending_utility.clear()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the engine process and remove the socket files."""
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(timeout)
        self.input_socket.close(linger=0)
        self.output_socket.close(linger=0)
        self.ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)
