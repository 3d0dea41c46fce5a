"""The body of one worker of the mp and ray executors: join the world, build the worker, serve commands.

A worker reads its commands from the executor's ``BroadcastChannel`` (one pickled message for all ranks) and
answers on its own connection (a pipe under mp, a ZMQ socket under ray): every command but a step, which only the
driver rank answers (the others reply only when the step failed on them). Under tensor or pipeline parallelism it
first joins the ``torch.distributed`` world (``init_parallel_state``, at the executor's rendezvous store: on
loopback under mp, on the EngineCore node's address under ray), so the model's layers find their groups as they
are built; on SHUTDOWN it tears the groups down (device groups before CPU groups, then the world).
``run_worker`` is the body both executors run: ``worker_main`` in an mp process, ``RayWorker.run`` in a Ray actor.
"""

from __future__ import annotations

import enum
import os
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from brigade import envs
from brigade.config import BrigadeConfig
from brigade.utils import freeze_gc_heap


class WorkerCommand(enum.IntEnum):
    """What the executor asks of a worker process."""

    DETERMINE_NUM_KV_BLOCKS = 0  # (KV cache groups) -> int (the minimum over every rank)
    INITIALIZE_KV_CACHE = 1  # (KVCacheConfig) -> None
    EXECUTE_MODEL = 2  # (SchedulerOutput) -> ModelRunnerOutput, from the driver rank only
    DESCRIBE = 3  # -> WorkerInfo
    SHUTDOWN = 4
    ADD_LORA = 5  # (LoRARequest) -> bool, or the LoRAError it raised
    REMOVE_LORA = 6  # (lora_int_id) -> bool
    KV_CACHE_LAYOUT = 7  # -> KVCacheLayout
    EXECUTE_DUMMY_BATCH = 8  # -> None: a forward pass of one dummy token (lockstep data-parallel engines)
    KV_CACHE_SPECS = 9  # -> {layer: KVCacheSpec} of the layers this rank holds


@dataclass(slots=True)
class WorkerInfo:
    """What a worker process reports about itself (for tests and the start-up log)."""

    pid: int
    rank: int
    start_method: str
    platform: str
    plugins: dict[str, str]  # entry-point name -> its status in that process (loaded, not detected, ...)
    attention_backend: str
    device: str = "cpu"
    place: str = ""  # its rank, local rank and rank in each group (ParallelState.describe), "" with one worker
    param_bytes: int = 0  # bytes of the model's parameters this rank holds
    expert_param_bytes: int = 0  # of which the MoE experts' stacked weights (0 for a dense model)


@dataclass(slots=True)
class WorkerReply:
    """A worker's answer: a value, or the error it raised (with its traceback)."""

    value: Any = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Where a worker process finds the others: its rank, the command channel, the rendezvous store."""

    rank: int
    world_size: int
    driver_rank: int  # the rank whose step outputs come back (the last stage's first TP rank)
    start_method: str
    channel: str  # the BroadcastChannel's address
    store: str  # HOST:PORT of the executor's rendezvous store ("" for one rank)
    local_rank: int | None = None  # its device index on its node; None: the rank (one node)


def worker_main(config: BrigadeConfig, hf_config, spec: WorkerSpec, conn) -> None:
    """Body of an mp worker process: watch the parent, then ``run_worker``."""
    import signal

    from brigade.parent_watch import watch_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group; the engine stops its workers
    watch_parent(f"worker rank {spec.rank}")  # a worker whose engine (or offline LLM) was killed exits too
    run_worker(config, hf_config, spec, conn)


def run_worker(config: BrigadeConfig, hf_config, spec: WorkerSpec, conn) -> None:
    """Load the plugins, build the platform's worker, answer its start-up on ``conn`` (a ``WorkerInfo``), then
    serve commands until SHUTDOWN. ``conn`` is anything with ``send(WorkerReply)``: a pipe, a ``ReplySender``."""
    from brigade.executor.broadcast import BroadcastSubscriber
    from brigade.plugins import load_plugins

    state = worker = None
    try:
        load_plugins("engine")  # a no-op after fork, a real load after spawn
        commands = BroadcastSubscriber(spec.channel)  # subscribe first: the executor waits for every rank
        worker, state, info = _start_worker(config, hf_config, spec)
        conn.send(WorkerReply(value=info))
    except BaseException as exc:
        conn.send(WorkerReply(error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        _tear_down(worker, state)
        return
    try:
        _serve(worker, state, info, spec, commands, conn)
    finally:
        _tear_down(worker, state)
        commands.close()


def _start_worker(config: BrigadeConfig, hf_config, spec: WorkerSpec):
    """Bind the device, join the world (several workers), load the model; returns (worker, state, info)."""
    from brigade.plugins import current_platform, plugin_records
    from brigade.utils import resolve_obj_by_qualname

    platform = current_platform()
    local_rank = spec.rank if spec.local_rank is None else spec.local_rank
    worker = resolve_obj_by_qualname(config.parallel_config.worker_cls)(config, local_rank=local_rank,
                                                                        rank=spec.rank)
    state = join_world(config, worker, spec.rank, spec.store)
    worker.init_device(hf_config)  # the runner sizes its KV cache for its stage and heads
    make_device_communicators(state, worker.device)
    worker.load_model()
    model = worker.model_runner.model
    info = WorkerInfo(pid=os.getpid(), rank=spec.rank, start_method=spec.start_method, platform=platform.name,
                      plugins={r.name: r.status.name.lower() for r in plugin_records()},
                      attention_backend=worker.attn_backend.name, device=str(worker.device),
                      place=state.describe() if state is not None else "",
                      param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
                      expert_param_bytes=expert_param_bytes(model))
    return worker, state, info


def expert_param_bytes(model) -> int:
    """Bytes of a model's MoE expert weights on this rank (its ``...experts.*`` parameters; 0 for a dense model)."""
    return sum(p.numel() * p.element_size() for name, p in model.named_parameters() if ".experts." in name)


def join_world(config: BrigadeConfig, worker, engine_rank: int, store: str):
    """Join the ``torch.distributed`` world of this worker's grid (``engine_world``): one engine's ``tp x pp``
    ranks at its executor's ``store``, or, when data-parallel engines step in lockstep, every engine's at the
    front end's store (``ParallelConfig.data_parallel_store``). Returns the rank's ``ParallelState``, or None
    for a world of one rank. Call it after the worker picked its device and before ``init_device``.

    Raises:
        RuntimeError: the rendezvous or a group creation failed (from ``torch.distributed``).
    """
    from brigade.distributed import engine_world, init_parallel_state
    from brigade.plugins import current_platform

    parallel = config.parallel_config
    grid, rank = engine_world(parallel, engine_rank)
    if grid.world_size == 1:
        return None
    if worker.device.type == "cpu" and not parallel.data_parallel_lockstep:
        # ranks share the cores: without this each spawns a thread per core (lockstep engines' placements already
        # set each engine's share in OMP_NUM_THREADS)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // grid.world_size))
    elif worker.device.type == "cpu" and parallel.world_size > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // parallel.world_size))
    if parallel.pipeline_parallel_size > 1:  # a stage's step waits on its neighbours: no graphs around it
        config.model_config.enforce_eager = True
    # Device communicators are made lazily, at the first collective, on the device bound by init_device.
    return init_parallel_state(grid, rank, local_rank=worker.local_rank, device=worker.device,
                               backend=current_platform().dist_backend,
                               store_address=parallel.data_parallel_store or store,
                               timeout_s=envs.BRIGADE_DISTRIBUTED_TIMEOUT)


def make_device_communicators(state, device: torch.device) -> None:
    """Make every device communicator now (a no-op without a world): CUDA graphs capture the collectives of a
    communicator that exists, and lockstep engines' first step does not pay for it."""
    if state is not None:
        for group in (state.world, state.tp, state.pp, state.dp, state.ep):
            group.all_reduce(torch.zeros(1, device=device))


def _serve(worker, state, info: WorkerInfo, spec: WorkerSpec, commands, conn) -> None:
    """Answer commands in order until SHUTDOWN (or the executor's pipe closes)."""
    handlers = {
        WorkerCommand.DETERMINE_NUM_KV_BLOCKS: lambda groups: _num_kv_blocks(worker, state, groups),
        WorkerCommand.INITIALIZE_KV_CACHE: lambda config: _initialize_kv_cache(worker, config),
        WorkerCommand.KV_CACHE_SPECS: lambda _: worker.kv_cache_specs(),
        WorkerCommand.EXECUTE_MODEL: worker.execute_model,
        WorkerCommand.DESCRIBE: lambda _: info,
        WorkerCommand.ADD_LORA: lambda request: _add_lora(worker, request),
        WorkerCommand.REMOVE_LORA: worker.remove_lora,
        WorkerCommand.KV_CACHE_LAYOUT: lambda _: worker.kv_cache_layout(),
        WorkerCommand.EXECUTE_DUMMY_BATCH: lambda _: worker.execute_dummy_batch(),
    }
    is_driver = spec.rank == spec.driver_rank
    while True:
        command, arg = commands.receive()
        if command == WorkerCommand.SHUTDOWN:
            return
        try:
            value = handlers[command](arg)
            if command != WorkerCommand.EXECUTE_MODEL or is_driver:
                conn.send(WorkerReply(value=value))
        except (BrokenPipeError, EOFError):
            return  # the executor is gone
        except BaseException as exc:
            try:
                conn.send(WorkerReply(error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
            except (BrokenPipeError, OSError):
                return


def _num_kv_blocks(worker, state, groups) -> int:
    """This rank's KV blocks under the KV cache ``groups``, then the minimum over every rank (all-reduce MIN on
    the world's CPU group): the scheduler's one pool must fit the tightest rank."""
    num_blocks = worker.determine_num_kv_blocks(groups)
    if state is None:
        return num_blocks
    import torch.distributed as dist

    value = torch.tensor([num_blocks], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=state.world.cpu_group)
    return int(value.item())


def _initialize_kv_cache(worker, config) -> None:
    """The worker's last start-up command: allocate the cache of ``config`` (a ``KVCacheConfig``; and capture
    graphs), then freeze the heap."""
    worker.initialize_kv_cache(config)
    freeze_gc_heap()


def _add_lora(worker, lora_request):
    """The worker's answer to ADD_LORA: a bad adapter is a reply (the LoRAError), not a dead worker."""
    from brigade.lora.adapter import LoRAError

    try:
        return worker.add_lora(lora_request)
    except LoRAError as exc:
        return exc


def _tear_down(worker, state) -> None:
    """Release the worker's connector threads and sockets, then the process groups (device ones first)."""
    try:
        if worker is not None:
            worker.shutdown()
    finally:
        if state is not None:
            state.destroy()
