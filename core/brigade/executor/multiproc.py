"""MultiprocExecutor: one worker process per device, driven over pipes with typed commands.

Workers start with ``fork`` or ``spawn`` (``BRIGADE_WORKER_MULTIPROC_METHOD``, default spawn). Each
worker process loads the general and platform plugins itself, so plugin code works in both (it must be
re-entrant). Commands are a fixed enum, never method names; a step's result is read back lazily, so
the EngineCore can overlap the next step's scheduling with this one. A worker answers its commands in
order, so before any other command the answers of the steps still unread are read and kept for their
``get()``.
"""

from __future__ import annotations

import collections
import enum
import logging
import multiprocessing
import os
import traceback
from dataclasses import dataclass
from typing import Any

from brigade import envs
from brigade.config import BrigadeConfig
from brigade.executor.abstract import Executor
from brigade.interfaces import AsyncModelRunnerOutput, ModelRunnerOutput, SchedulerOutput
from brigade.utils import freeze_gc_heap

logger = logging.getLogger(__name__)

_START_METHODS = ("spawn", "fork", "forkserver")


class WorkerCommand(enum.IntEnum):
    """What the executor asks of a worker process."""

    DETERMINE_NUM_KV_BLOCKS = 0  # -> int
    INITIALIZE_KV_CACHE = 1  # (num_blocks) -> None
    EXECUTE_MODEL = 2  # (SchedulerOutput) -> ModelRunnerOutput
    DESCRIBE = 3  # -> WorkerInfo
    SHUTDOWN = 4
    ADD_LORA = 5  # (LoRARequest) -> bool, or the LoRAError it raised
    REMOVE_LORA = 6  # (lora_int_id) -> bool
    KV_CACHE_LAYOUT = 7  # -> KVCacheLayout


@dataclass(slots=True)
class WorkerInfo:
    """What a worker process reports about itself (for tests and logs)."""

    pid: int
    rank: int
    start_method: str
    platform: str
    plugins: dict[str, str]  # entry-point name -> its status in that process (loaded, not detected, ...)
    attention_backend: str


@dataclass(slots=True)
class WorkerReply:
    """A worker's answer: a value, or the error it raised (with its traceback)."""

    value: Any = None
    error: str | None = None


class WorkerDiedError(RuntimeError):
    """A worker process failed or exited; the engine cannot continue."""


def _worker_main(config: BrigadeConfig, hf_config, rank: int, start_method: str, conn) -> None:
    """Body of a worker process: build the platform's worker, then serve commands until SHUTDOWN."""
    from brigade.parent_watch import watch_parent
    from brigade.plugins import current_platform, load_plugins, plugin_records
    from brigade.utils import resolve_obj_by_qualname

    watch_parent(f"worker rank {rank}")  # a worker whose engine (or offline LLM) was killed exits too
    try:
        load_plugins("engine")  # a no-op after fork, a real load after spawn
        platform = current_platform()
        worker = resolve_obj_by_qualname(config.parallel_config.worker_cls)(config, local_rank=rank, rank=rank)
        worker.init_device(hf_config)
        worker.load_model()
        info = WorkerInfo(pid=os.getpid(), rank=rank, start_method=start_method, platform=platform.name,
                          plugins={r.name: r.status.name.lower() for r in plugin_records()},
                          attention_backend=worker.attn_backend.name)
        conn.send(WorkerReply(value=info))
    except BaseException as exc:
        conn.send(WorkerReply(error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        return
    handlers = {
        WorkerCommand.DETERMINE_NUM_KV_BLOCKS: lambda _: worker.determine_num_kv_blocks(),
        WorkerCommand.INITIALIZE_KV_CACHE: lambda num_blocks: _initialize_kv_cache(worker, num_blocks),
        WorkerCommand.EXECUTE_MODEL: worker.execute_model,
        WorkerCommand.DESCRIBE: lambda _: info,
        WorkerCommand.ADD_LORA: lambda request: _add_lora(worker, request),
        WorkerCommand.REMOVE_LORA: worker.remove_lora,
        WorkerCommand.KV_CACHE_LAYOUT: lambda _: worker.kv_cache_layout(),
    }
    try:
        while True:
            try:
                command, arg = conn.recv()
            except EOFError:
                return  # the executor is gone
            if command == WorkerCommand.SHUTDOWN:
                return
            try:
                conn.send(WorkerReply(value=handlers[command](arg)))
            except BaseException as exc:
                conn.send(WorkerReply(error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        worker.shutdown()  # the KV connector's threads and sockets


def _initialize_kv_cache(worker, num_blocks: int) -> None:
    """The worker's last start-up command: allocate the cache (and capture graphs), then freeze the heap."""
    worker.initialize_kv_cache(num_blocks)
    freeze_gc_heap()


def _add_lora(worker, lora_request):
    """The worker's answer to ADD_LORA: a bad adapter is a reply (the LoRAError), not a dead worker."""
    from brigade.lora.adapter import LoRAError

    try:
        return worker.add_lora(lora_request)
    except LoRAError as exc:
        return exc


class PendingReplies:
    """The workers' answers to one EXECUTE_MODEL, read on ``get()`` (the driver's output is returned), or
    earlier by ``fetch()`` when another command's answers come after them."""

    def __init__(self, executor: MultiprocExecutor):
        self.executor = executor
        self.values: list[Any] | None = None

    def fetch(self) -> None:
        """Read the answers now and keep them for ``get()``."""
        if self.values is None:
            self.values = self.executor._collect()

    def get(self) -> ModelRunnerOutput:
        while self.values is None:  # the answers of the steps sent before this one come first
            self.executor._outstanding.popleft().fetch()
        return self.values[0]


class MultiprocExecutor(Executor):
    """Starts ``world_size`` worker processes and broadcasts every command to all of them.

    Raises:
        ConfigError (a ValueError): for tensor or pipeline parallelism above 1 (the model is not sharded yet),
            from ``BrigadeConfig.check_supported``.
        WorkerDiedError: when a worker fails to start or dies.
    """

    def __init__(self, config: BrigadeConfig, hf_config):
        super().__init__(config, hf_config)
        config.check_supported()  # the model is not sharded yet: one worker process
        parallel = config.parallel_config
        method = envs.BRIGADE_WORKER_MULTIPROC_METHOD
        if method not in _START_METHODS:
            raise ValueError(f"BRIGADE_WORKER_MULTIPROC_METHOD={method!r} is not known; use "
                             f"{', '.join(_START_METHODS)}")
        ctx = multiprocessing.get_context(method)
        self.conns = []
        self.procs = []
        self._outstanding: collections.deque[PendingReplies] = collections.deque()  # steps not read yet, in order
        for rank in range(parallel.world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(config, hf_config, rank, method, child), daemon=True,
                               name=f"BrigadeWorker-{rank}")
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        self.worker_info: list[WorkerInfo] = self._collect()
        logger.info("started %d worker process(es) with %s: pids %s", len(self.procs), method,
                    [i.pid for i in self.worker_info])

    def _broadcast(self, command: WorkerCommand, arg: Any = None) -> None:
        for conn in self.conns:
            conn.send((command, arg))

    def _call(self, command: WorkerCommand, arg: Any = None) -> list[Any]:
        """Send a command that is not a step and wait for every worker's answer. The answers of steps still
        unread come first on the pipes; they are read and kept for their ``get()``."""
        while self._outstanding:
            self._outstanding.popleft().fetch()
        self._broadcast(command, arg)
        return self._collect()

    def _collect(self) -> list[Any]:
        values = []
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs)):
            try:
                reply: WorkerReply = conn.recv()
            except EOFError:
                raise WorkerDiedError(f"worker {rank} (pid {proc.pid}) exited with code {proc.exitcode}") from None
            if reply.error is not None:
                raise WorkerDiedError(f"worker {rank} failed: {reply.error}")
            values.append(reply.value)
        return values

    def determine_num_kv_blocks(self) -> int:
        return min(self._call(WorkerCommand.DETERMINE_NUM_KV_BLOCKS))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self._call(WorkerCommand.INITIALIZE_KV_CACHE, num_blocks)

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

    def shutdown(self) -> None:
        for conn in self.conns:
            try:
                conn.send((WorkerCommand.SHUTDOWN, None))
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
