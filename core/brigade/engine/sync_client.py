"""SyncMPClient: the offline LLM's blocking link to its data-parallel EngineCore processes.

``LLM(model, data_parallel_size=N)`` with N > 1 runs N engine processes (``engine_procs.py``), like the server,
instead of one EngineCore in the caller's process; ``LLMEngine`` then calls this client exactly as it calls an
in-process ``EngineCore``: ``add_requests``, ``abort_requests``, ``step``, ``call_utility``, ``add_lora``,
``remove_lora``, ``shutdown``. New requests go to the least-loaded engine (``load_balancer.py``), control calls to
every engine.
"""

from __future__ import annotations

import collections
import itertools
import math
import shutil
import tempfile
import time
import weakref

import msgspec
import zmq

from brigade.config import BrigadeConfig
from brigade.engine.core_client import EngineDeadError, UtilityCallError
from brigade.engine.engine_procs import EngineProcs, engine_label
from brigade.engine.load_balancer import LoadBalancer, merge_utility_results
from brigade.interfaces import (EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType,
                                EngineCoreUtility, LoRARequest, UtilityMethod)
from brigade.lora.adapter import LoRAError

_LIVENESS_POLL_MS = 1000
_LIVENESS_CHECK_S = 0.2


def _close(engines: EngineProcs | None, sockets: list, ctx: zmq.Context, directory: str) -> None:
    """Stop the engines and release the sockets (also run by the finalizer when the client is collected)."""
    if engines is not None:
        engines.shutdown()
    for sock in sockets:
        sock.close(linger=0)
    ctx.term()
    shutil.rmtree(directory, ignore_errors=True)


class SyncMPClient:
    """Blocking counterpart of ``AsyncMPClient`` for ``LLMEngine``; step outputs that arrive while a control call
    waits for its answers are kept, in order, for the next ``step()``.

    Raises:
        EngineStartupError: an engine failed to start (naming it).
    """

    def __init__(self, config: BrigadeConfig):
        self.num_engines = config.parallel_config.data_parallel_size
        self._dir = tempfile.mkdtemp(prefix="brigade-")
        self.ctx = zmq.Context()
        self.output_socket = self.ctx.socket(zmq.PULL)
        self.output_socket.bind(f"ipc://{self._dir}/output")
        addresses = [f"ipc://{self._dir}/input-{index}" for index in range(self.num_engines)]
        self.input_sockets = [self.ctx.socket(zmq.PUSH) for _ in addresses]
        for sock, address in zip(self.input_sockets, addresses):
            sock.bind(address)
        sockets = [*self.input_sockets, self.output_socket]
        try:
            self.engines = EngineProcs(config, addresses, f"ipc://{self._dir}/output")
        except BaseException:
            _close(None, sockets, self.ctx, self._dir)
            raise
        self._finalizer = weakref.finalize(self, _close, self.engines, sockets, self.ctx, self._dir)
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
        self.balancer = LoadBalancer(self.num_engines)
        self._call_ids = itertools.count()
        self._held: collections.deque[EngineCoreOutputs] = collections.deque()
        self._last_liveness_check = time.monotonic()

    def add_requests(self, requests: list[EngineCoreRequest]) -> list[EngineCoreOutput]:
        """Send requests (the children of one ``n > 1`` request) to the least-loaded engine, all to the same one.
        Returns []: an engine's refusals come back through ``step()``."""
        engine = self.balancer.choose()
        self.balancer.add(engine, [r.request_id for r in requests])
        for request in requests:
            self.input_sockets[engine].send_multipart([EngineCoreRequestType.ADD.value, self.encoder.encode(request)])
        return []

    def abort_requests(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        """Abort each request in the engine that owns it. Returns []: engines report no output for an abort."""
        for engine, ids in self.balancer.take_owners(request_ids).items():
            self.input_sockets[engine].send_multipart([EngineCoreRequestType.ABORT.value, self.encoder.encode(ids)])
        return []

    def step(self) -> EngineCoreOutputs:
        """The next step outputs of any engine (blocks until one arrives).

        Raises:
            EngineDeadError: an engine failed or its process is gone (the message names it).
        """
        while True:
            outputs = self._held.popleft() if self._held else self._receive()
            if outputs.utility_call_id is None:
                return outputs

    def _receive(self) -> EngineCoreOutputs:
        """The next message of any engine; checks the processes every 0.2 s even while other engines send."""
        while True:
            if time.monotonic() - self._last_liveness_check >= _LIVENESS_CHECK_S:
                self._last_liveness_check = time.monotonic()
                exited = self.engines.exited()
                if exited is not None and not self.output_socket.poll(0):  # its last words first, if any
                    self.engines.stop_all()
                    raise EngineDeadError(exited)
            if self.output_socket.poll(_LIVENESS_POLL_MS):
                outputs = self.decoder.decode(self.output_socket.recv())
                if outputs.engine_error is not None:
                    self.engines.stop_all()
                    raise EngineDeadError(engine_label(outputs.engine_index, self.num_engines)
                                          + outputs.engine_error)
                if outputs.utility_call_id is None:
                    self.balancer.report(outputs)
                return outputs
            self._last_liveness_check = -math.inf  # a second of silence: check now

    def call_utility(self, method: UtilityMethod, lora_request=None):
        """Call a control method in every engine and merge the answers (``merge_utility_results``).

        Raises:
            UtilityCallError: an engine refused it (an ADD_LORA is then undone in the engines that took it).
            EngineDeadError: an engine died before answering.
        """
        call_ids = {}
        for engine in range(self.num_engines):
            call_id = next(self._call_ids)
            call_ids[call_id] = engine
            message = EngineCoreUtility(call_id, method, lora_request)
            self.input_sockets[engine].send_multipart([EngineCoreRequestType.UTILITY.value,
                                                       self.encoder.encode(message)])
        answers: dict[int, EngineCoreOutputs] = {}
        while len(answers) < len(call_ids):
            outputs = self._receive()
            if outputs.utility_call_id in call_ids:
                answers[call_ids[outputs.utility_call_id]] = outputs
            else:
                self._held.append(outputs)
        errors = [a.utility_error for a in answers.values() if a.utility_error is not None]
        if errors:
            if method == UtilityMethod.ADD_LORA:
                self._undo_add_lora(answers, lora_request)
            raise UtilityCallError(errors[0])
        return merge_utility_results(method, [msgspec.msgpack.decode(answers[e].utility_result)
                                              for e in range(self.num_engines)])

    def _undo_add_lora(self, answers: dict[int, EngineCoreOutputs], lora_request) -> None:
        for engine, answer in answers.items():
            if answer.utility_error is None and msgspec.msgpack.decode(answer.utility_result):
                message = EngineCoreUtility(next(self._call_ids), UtilityMethod.REMOVE_LORA, lora_request)
                self.input_sockets[engine].send_multipart([EngineCoreRequestType.UTILITY.value,
                                                           self.encoder.encode(message)])

    def add_lora(self, lora_request) -> bool:
        """Register a LoRA adapter in every engine (``EngineCore.add_lora``). Raises LoRAError when refused."""
        try:
            return self.call_utility(UtilityMethod.ADD_LORA, lora_request)
        except UtilityCallError as exc:
            raise LoRAError(str(exc)) from None

    def remove_lora(self, lora_int_id: int) -> bool:
        """Unload a LoRA adapter in every engine (``EngineCore.remove_lora``)."""
        return self.call_utility(UtilityMethod.REMOVE_LORA, LoRARequest("", lora_int_id, ""))

    def shutdown(self) -> None:
        """Stop the engine processes and remove the socket files (idempotent)."""
        self._finalizer()
