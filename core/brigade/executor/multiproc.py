"""MultiprocExecutor: one worker process per rank, each step broadcast to all of them in one message.

Workers start with ``fork`` or ``spawn`` (``BRIGADE_WORKER_MULTIPROC_METHOD``, default spawn). Each worker process
loads the general and platform plugins itself, so plugin code works in both (it must be re-entrant). With several
ranks (``-tp`` above 1) the workers join a ``torch.distributed`` world at a rendezvous store this executor hosts
on loopback (``distributed/rendezvous.py``, ``worker_proc``). Commands are a fixed enum, never method names,
published once on a ``BroadcastChannel``; each worker answers on its own pipe, and a step's output comes from the
driver rank alone. A step's result is read back lazily, so the EngineCore can overlap the next step's scheduling
with this one. A worker answers its commands in order, so before any other command the answers of the steps still
unread are read and kept for their ``get()``.

A worker that dies (killed, out of memory) or fails is noticed while the executor waits for any answer (its
process sentinel is watched with the pipes): ``WorkerDiedError`` names the rank and the cause, the EngineCore
fails, and the front end ends every request with that error, as for the engine's own death.

The ray executor (``ray_executor.py``) keeps this protocol and replaces only its transport: the methods under
"the transport" below (how answers are awaited and read, how a worker's end is noticed and described).
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import signal
from multiprocessing.connection import wait
from typing import Any

from brigade import envs
from brigade.config import BrigadeConfig
from brigade.distributed.rendezvous import RendezvousStore
from brigade.executor.abstract import Executor
from brigade.executor.broadcast import BroadcastChannel
from brigade.executor.worker_proc import WorkerCommand, WorkerInfo, WorkerReply, WorkerSpec, worker_main
from brigade.interfaces import AsyncModelRunnerOutput, ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)

_START_METHODS = ("spawn", "fork", "forkserver")
DEATH_GRACE_S = 0.5  # after a rank's error, how long to look for a dead peer that caused it

__all__ = ["MultiprocExecutor", "WorkerCommand", "WorkerDiedError", "WorkerInfo"]


class WorkerDiedError(RuntimeError):
    """A worker process failed or exited; the engine cannot continue."""


class PendingReplies:
    """The driver's answer to one EXECUTE_MODEL, read on ``get()``, or earlier by ``fetch()`` when another
    command's answers come after it."""

    def __init__(self, executor: MultiprocExecutor):
        self.executor = executor
        self.value: Any = None
        self.fetched = False

    def fetch(self) -> None:
        """Read the answer now and keep it for ``get()``."""
        if not self.fetched:
            self.value = self.executor._receive(self.executor.driver_rank, step=True)
            self.fetched = True

    def get(self) -> ModelRunnerOutput:
        while not self.fetched:  # the answers of the steps sent before this one come first
            self.executor._outstanding.popleft().fetch()
        return self.value


def death_cause(exitcode: int | None) -> str:
    """How a process ended, in words: "killed by SIGKILL", "exited with code 1"."""
    if exitcode is None:
        return "is gone"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def worker_error_line(error: str) -> str:
    """A worker's reported error (``"Type: message"`` then its traceback) as one line: the first line, and for a
    collective that timed out, which setting bounds the wait. The whole report is logged at DEBUG."""
    logger.debug("a worker reported: %s", error)
    line = error.split("\n", 1)[0]
    if "timed out" in line.lower():
        line += (f" (a collective stalled past BRIGADE_DISTRIBUTED_TIMEOUT={envs.BRIGADE_DISTRIBUTED_TIMEOUT:g} s: "
                 "a peer rank is stopped or stuck)")
    return line


class MultiprocExecutor(Executor):
    """Starts ``world_size`` worker processes and broadcasts every command to all of them.

    Raises:
        ConfigError (a ValueError): a setting this build cannot run, from ``BrigadeConfig.check_supported``.
        WorkerDiedError: when a worker fails to start or dies.
    """

    def __init__(self, config: BrigadeConfig, hf_config):
        super().__init__(config, hf_config)
        config.check_supported()
        parallel = config.parallel_config
        method = envs.BRIGADE_WORKER_MULTIPROC_METHOD
        if method not in _START_METHODS:
            raise ValueError(f"BRIGADE_WORKER_MULTIPROC_METHOD={method!r} is not known; use "
                             f"{', '.join(_START_METHODS)}")
        ctx = multiprocessing.get_context(method)
        self.world_size = parallel.world_size
        self.driver_rank = self.world_size - parallel.tensor_parallel_size  # the last stage's first TP rank
        self.channel = BroadcastChannel()
        # Lockstep data-parallel engines' workers meet at the front end's store (ParallelConfig.data_parallel_store).
        self.store = RendezvousStore("127.0.0.1") if self.world_size > 1 and not parallel.data_parallel_lockstep \
            else None
        self.conns, self.procs = [], []
        self._outstanding: collections.deque[PendingReplies] = collections.deque()  # steps not read yet, in order
        # The server's EngineCore is itself a daemonic process, and multiprocessing refuses children to those (so
        # that none outlives a terminated parent); workers watch their parent instead (``parent_watch``).
        multiprocessing.current_process().daemon = False
        try:
            for rank in range(self.world_size):
                spec = WorkerSpec(rank, self.world_size, self.driver_rank, method, self.channel.address,
                                  self.store.address if self.store is not None else "")
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=worker_main, args=(config, hf_config, spec, child), daemon=True,
                                   name=f"BrigadeWorker-{rank}")
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
            self.worker_info: list[WorkerInfo] = self._collect()
            self.channel.wait_for_subscribers(self.world_size, self._check_alive)
        except BaseException:
            self.shutdown()
            raise
        logger.info("started %d worker process(es) with %s: pids %s", len(self.procs), method,
                    [i.pid for i in self.worker_info])

    # ---- talking to the workers -----------------------------------------------------------------
    def _broadcast(self, command: WorkerCommand, arg: Any = None) -> None:
        self.channel.publish((command, arg))

    def _call(self, command: WorkerCommand, arg: Any = None) -> list[Any]:
        """Send a command that is not a step and wait for every worker's answer. The answers of steps still
        unread come first on the driver's pipe; they are read and kept for their ``get()``."""
        while self._outstanding:
            self._outstanding.popleft().fetch()
        self._broadcast(command, arg)
        return self._collect()

    def _collect(self) -> list[Any]:
        return [self._receive(rank) for rank in range(self.world_size)]

    def _receive(self, rank: int, *, step: bool = False) -> Any:
        """Rank ``rank``'s next answer. Meanwhile any worker's death raises instead of leaving the wait hanging,
        and so, while waiting for a ``step``'s answer, does an error another rank reports (only failures come
        unasked then: the other ranks do not answer steps).

        Raises:
            WorkerDiedError: naming the rank and the cause.
        """
        others = [r for r in range(self.world_size) if r != rank] if step else []
        while True:
            ready = self._wait_replies([rank, *others])
            if rank in ready:
                return self._read(rank)
            for other in ready:  # only a failure comes unasked
                self._read(other)
            self._check_alive()

    def _read(self, rank: int) -> Any:
        try:
            reply: WorkerReply = self._recv(rank)
        except (EOFError, OSError):
            raise WorkerDiedError(self._death_of(rank)) from None
        if reply.error is not None:
            # A rank killed in a collective makes its peers fail too (the connection closed): name the dead one.
            self._wait_for_death(DEATH_GRACE_S)
            self._check_alive(read_errors=False)
            raise WorkerDiedError(f"worker rank {rank} failed: {worker_error_line(reply.error)}")
        return reply.value

    def _check_alive(self, *, read_errors: bool = True) -> None:
        """Raises WorkerDiedError for the first worker that has ended (with the error it reported, when it
        reported one before exiting)."""
        for rank, cause in self._ended():
            if read_errors and self._has_reply(rank):
                self._read(rank)
            raise WorkerDiedError(cause)

    # ---- the transport: pipes and process sentinels (the ray executor replaces these) -----------
    def _wait_replies(self, ranks: list[int]) -> set[int]:
        """Block until one of ``ranks`` has an answer ready or any worker ended; the ranks with an answer."""
        conns = {self.conns[r]: r for r in ranks}
        ready = wait([*conns, *(p.sentinel for p in self.procs)])
        return {conns[c] for c in ready if c in conns}

    def _recv(self, rank: int) -> WorkerReply:
        """Rank ``rank``'s next reply (there is one). Raises EOFError or OSError when the worker is gone."""
        return self.conns[rank].recv()

    def _has_reply(self, rank: int) -> bool:
        return self.conns[rank].poll()

    def _death_of(self, rank: int) -> str:
        """How worker ``rank`` ended, in one line: "worker rank 1 (pid 42) killed by SIGKILL"."""
        proc = self.procs[rank]
        proc.join(timeout=1.0)
        return f"worker rank {rank} (pid {proc.pid}) {death_cause(proc.exitcode)}"

    def _ended(self) -> list[tuple[int, str]]:
        """The workers that have ended, as (rank, how it ended)."""
        return [(rank, self._death_of(rank)) for rank, proc in enumerate(self.procs) if not proc.is_alive()]

    def _wait_for_death(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for any worker to end."""
        wait([p.sentinel for p in self.procs], timeout=timeout_s)

    # ---- the Executor interface -----------------------------------------------------------------
    def kv_cache_specs(self):
        specs = {}
        for rank_specs in self._call(WorkerCommand.KV_CACHE_SPECS):
            specs.update(rank_specs)
        return specs

    def determine_num_kv_blocks(self, groups) -> int:
        return min(self._call(WorkerCommand.DETERMINE_NUM_KV_BLOCKS, groups))

    def initialize_kv_cache(self, config) -> None:
        num_blocks = config.num_blocks
        self._call(WorkerCommand.INITIALIZE_KV_CACHE, config)
        if self.world_size > 1:
            parallel = self.config.parallel_config
            dp = parallel.data_parallel_size if parallel.data_parallel_lockstep else 1
            # With lockstep engines the grid is every engine's; the driver rank is this engine's own.
            logger.info("grid dp %d x pp %d x tp %d, %d ranks, driver rank %d; each rank's KV cache holds %d blocks "
                        "of its own KV heads", dp, parallel.pipeline_parallel_size, parallel.tensor_parallel_size,
                        dp * self.world_size, self.driver_rank, num_blocks)
            for info in self.worker_info:
                experts = f" ({info.expert_param_bytes / 2**20:.1f} MiB of experts)" if info.expert_param_bytes else ""
                logger.info("  %s, pid %d, %.1f MiB of parameters%s", info.place, info.pid, info.param_bytes / 2**20,
                            experts)

    def kv_cache_layout(self):
        return self._call(WorkerCommand.KV_CACHE_LAYOUT)[0]

    def add_lora(self, lora_request) -> bool:
        replies = self._call(WorkerCommand.ADD_LORA, lora_request)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies[0]

    def remove_lora(self, lora_int_id: int) -> bool:
        return self._call(WorkerCommand.REMOVE_LORA, lora_int_id)[0]

    def execute_model(self, scheduler_output: SchedulerOutput, *,
                      overlap: bool = False) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        self._broadcast(WorkerCommand.EXECUTE_MODEL, scheduler_output)
        pending = PendingReplies(self)
        self._outstanding.append(pending)
        return pending if overlap else pending.get()

    def execute_dummy_batch(self) -> None:
        self._call(WorkerCommand.EXECUTE_DUMMY_BATCH)

    def shutdown(self) -> None:
        """Ask every worker to stop, wait for them (10 s), kill those left; idempotent."""
        try:
            self._broadcast(WorkerCommand.SHUTDOWN)
        except Exception:  # noqa: BLE001 - a closed channel: the workers are told by their parent watch
            pass
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.store is not None:
            self.store.close()
            self.store = None
