"""The EngineCore process: a busy loop fed and drained over ZMQ by two I/O threads.

Sockets carry msgspec-encoded messages. The front end binds both sockets; this process connects. The
loop blocks only when no request is in flight, so an idle engine costs nothing and a busy one never
waits on I/O. If the engine fails, it sends one message carrying the error and exits, so the front end
can fail every in-flight request instead of hanging.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
import traceback

import msgspec
import zmq

from brigade import envs
from brigade.config import BrigadeConfig
from brigade.engine.core import EngineCore
from brigade.engine.dp_lockstep import DPLockstep
from brigade.interfaces import EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType, EngineCoreUtility
from brigade.lora.adapter import LoRAError
from brigade.parent_watch import watch_parent

logger = logging.getLogger("brigade.engine")

_POLL_PARENT_S = 1.0


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(0)


def _reset_after_fork() -> None:
    """In a forked engine: no signal wake-up fd shared with the front end's event loop, no logging handlers of the front end, and the torch thread count its
    placement set in ``OMP_NUM_THREADS`` (torch read the variable in the front end, before the fork)."""
    signal.set_wakeup_fd(-1)
    logging.getLogger().handlers.clear()
    threads = os.environ.get("OMP_NUM_THREADS", "").strip()
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))


def run_engine_core(config: BrigadeConfig, input_address: str, output_address: str, ready_pipe,
                    forked: bool = False) -> None:
    """Entry point of the EngineCore process (started by spawn, or by fork on platforms that say so).

    A forked engine first undoes what it inherited from the front end's process (``_reset_after_fork``).
    ``config.parallel_config.data_parallel_rank`` is this engine's index among the data-parallel engines (set by
    the front end); it stamps every message it sends and its log lines ("[engine 1]") when there are several.
    """
    if forked:
        _reset_after_fork()
    parallel = config.parallel_config
    engine_index = parallel.data_parallel_rank or 0
    name = "engine" if parallel.data_parallel_size == 1 else f"engine {engine_index}"
    logging.basicConfig(level=envs.BRIGADE_LOGGING_LEVEL,
                        format=f"%(levelname)s %(asctime)s [{name}] %(message)s")
    signal.signal(signal.SIGTERM, _exit_on_signal)
    # A terminal's Ctrl-C reaches the whole process group; the front end decides how its engines stop (SIGTERM,
    # or SIGKILL when interrupted during start-up), so that no engine reports a KeyboardInterrupt of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent(name)  # an orphaned engine exits within a second, busy or not
    try:
        core = EngineCore(config)
    except BaseException as exc:  # report any start-up failure to the parent, then exit
        ready_pipe.send({"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()})
        return
    ready_pipe.send({"status": "ready", "num_blocks": core.num_blocks,
                     "max_model_len": config.model_config.max_model_len})
    EngineCoreProc(core, input_address, output_address, engine_index).run()


class EngineCoreProc:
    """Wraps an EngineCore with the input and output threads and the busy loop.

    Every message it sends carries its ``engine_index`` and the number of requests it has taken so far (counted
    on the busy loop's thread, which also makes the step's scheduler stats, so the two agree).
    """

    def __init__(self, core: EngineCore, input_address: str, output_address: str, engine_index: int = 0):
        self.core = core
        parallel = core.config.parallel_config
        # Experts spread over every engine: each loop turn is agreed with the others (dp_lockstep.py).
        self.lockstep = DPLockstep(parallel) if parallel.data_parallel_lockstep else None
        self.engine_index = engine_index
        self.num_requests_received = 0
        self.parent_pid = os.getppid()
        self.inputs: queue.Queue = queue.Queue()
        self.outputs: queue.Queue = queue.Queue()
        self.ctx = zmq.Context()
        threading.Thread(target=self._input_thread, args=(input_address,), daemon=True,
                         name="brigade-core-input").start()
        threading.Thread(target=self._output_thread, args=(output_address,), daemon=True,
                         name="brigade-core-output").start()

    def _input_thread(self, address: str) -> None:
        sock = self.ctx.socket(zmq.PULL)
        sock.connect(address)
        add_decoder = msgspec.msgpack.Decoder(EngineCoreRequest)
        abort_decoder = msgspec.msgpack.Decoder(list[str])
        utility_decoder = msgspec.msgpack.Decoder(EngineCoreUtility)
        while True:
            kind, payload = sock.recv_multipart(copy=False)
            kind = EngineCoreRequestType(bytes(kind.buffer))
            decoder = {EngineCoreRequestType.ADD: add_decoder, EngineCoreRequestType.ABORT: abort_decoder,
                       EngineCoreRequestType.UTILITY: utility_decoder}[kind]
            self.inputs.put((kind, decoder.decode(payload.buffer)))

    def _output_thread(self, address: str) -> None:
        sock = self.ctx.socket(zmq.PUSH)
        sock.connect(address)  # with data parallelism every engine connects to the front end's one output socket
        encoder = msgspec.msgpack.Encoder()
        while True:
            outputs = self.outputs.get()
            sock.send(encoder.encode(outputs), copy=False)

    def _publish(self, outputs: EngineCoreOutputs) -> None:
        """Stamp ``outputs`` with this engine's index and request count, and queue it for the output thread."""
        outputs.engine_index = self.engine_index
        outputs.num_requests_received = self.num_requests_received
        if outputs.scheduler_stats is not None:
            outputs.scheduler_stats.engine_index = self.engine_index
        self.outputs.put(outputs)

    def _handle(self, kind: EngineCoreRequestType, message) -> None:
        if kind == EngineCoreRequestType.ADD:
            self.num_requests_received += 1
            refused = self.core.add_request(message)
            if refused is not None:
                self._publish(EngineCoreOutputs(outputs=[refused], timestamp=time.time()))
        elif kind == EngineCoreRequestType.ABORT:
            self.core.abort_requests(message)
            # Publish the new gauges now: an idle engine runs no step that would.
            self._publish(EngineCoreOutputs(scheduler_stats=self.core.scheduler.make_stats(), timestamp=time.time()))
        else:
            try:
                result = self.core.call_utility(message.method, message.lora_request)
            except LoRAError as exc:  # the caller's mistake (a bad adapter), answered; the engine lives on
                self._publish(EngineCoreOutputs(utility_call_id=message.call_id, utility_error=str(exc)))
                return
            self._publish(EngineCoreOutputs(utility_call_id=message.call_id,
                                            utility_result=msgspec.msgpack.encode(result)))

    def _drain_inputs(self) -> None:
        """Block while the engine has nothing to do until a message arrives, then handle every queued one."""
        while not self.core.has_unfinished_requests() and not self._wait_for_input(_POLL_PARENT_S):
            pass
        self._handle_queued()

    def _take_inputs(self, wait_s: float) -> None:
        """Handle what the input queue holds, waiting up to ``wait_s`` for a first message (0: not at all)."""
        if wait_s > 0:
            self._wait_for_input(wait_s)
        self._handle_queued()

    def _wait_for_input(self, timeout_s: float) -> bool:
        """Handle one message if one arrives within ``timeout_s``; returns whether one did. Raises SystemExit when
        the wait ends empty and the front-end process is gone."""
        try:
            self._handle(*self.inputs.get(timeout=timeout_s))
            return True
        except queue.Empty:
            if os.getppid() != self.parent_pid:
                raise SystemExit("the front-end process is gone") from None
            return False

    def _handle_queued(self) -> None:
        """Handle every message already in the input queue, without waiting."""
        while True:
            try:
                self._handle(*self.inputs.get_nowait())
            except queue.Empty:
                return

    def _step_and_publish(self) -> None:
        outputs = self.core.step()
        if outputs.outputs or outputs.scheduler_stats is not None:
            self._publish(outputs)

    def _run_lockstep(self) -> None:
        """The loop of a lockstep engine: each turn, agree with the other engines whether any has work; if so
        step (or, with nothing of its own, run a dummy batch), else wait briefly for a request."""
        lockstep = self.lockstep
        while True:
            self._take_inputs(lockstep.input_wait_s(self.core.has_unfinished_requests()))
            busy = self.core.has_unfinished_requests()
            if not lockstep.any_busy(busy):
                continue
            if busy:
                self._step_and_publish()
            else:
                self.core.execute_dummy_batch()
                lockstep.num_dummy_batches += 1

    def run(self) -> None:
        """The busy loop: take inputs, step, publish outputs, until the parent goes away."""
        try:
            if self.lockstep is not None:
                self._run_lockstep()
            while True:
                self._drain_inputs()
                self._step_and_publish()
        except SystemExit:
            raise
        except BaseException as exc:
            logger.exception("EngineCore failed")
            self._publish(EngineCoreOutputs(engine_error=f"{type(exc).__name__}: {exc}", timestamp=time.time()))
            time.sleep(0.5)  # let the output thread send it
            raise SystemExit(1)

