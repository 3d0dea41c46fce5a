"""ParallelState: this rank's process groups for every parallel dimension, built and torn down in order.

``init_parallel_state`` joins the world over ``torch.distributed`` (at the executor's rendezvous store, on
loopback for one node: ``rendezvous.py``), then
builds each dimension's groups from a ``RankGrid`` exactly as vLLM's ``initialize_model_parallel`` does. Every
rank creates every group, in the same order (``new_group`` is itself a collective: a rank that skips one hangs the
others). ``destroy`` undoes it in reverse: the groups (each destroying its device group before its CPU group), then
the world.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from brigade.distributed.grid import RankGrid
from brigade.distributed.group import GroupCoordinator
from brigade.distributed.rendezvous import connect_store

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0  # a collective that stalls longer fails with an error instead of hanging

_STATE: ParallelState | None = None  # this process's groups, once init_parallel_state has run


@dataclass(slots=True)
class ParallelState:
    """This rank's groups. ``tp``/``pp``/``dp`` are the grid's dimensions; ``ep`` the DP x TP ranks of the stage."""

    grid: RankGrid
    world: GroupCoordinator
    tp: GroupCoordinator
    pp: GroupCoordinator
    dp: GroupCoordinator
    ep: GroupCoordinator

    def describe(self) -> str:
        """One log line: the rank, its device and its place in each dimension."""
        w = self.world
        # The EP group is the TP group inside one engine; across engines (lockstep DP) it is named too.
        ep = f", ep {self.ep.rank_in_group}/{self.ep.world_size}" if self.grid.dp > 1 else ""
        return (f"rank {w.rank}/{w.world_size} (local rank {w.local_rank}, device {w.device}): "
                f"dp {self.dp.rank_in_group}/{self.grid.dp}, pp {self.pp.rank_in_group}/{self.grid.pp}, "
                f"tp {self.tp.rank_in_group}/{self.grid.tp}{ep}")

    def destroy(self) -> None:
        """Destroy every group (device groups before CPU groups), then the world's process group."""
        global _STATE
        for group in (self.ep, self.dp, self.pp, self.tp, self.world):
            group.destroy()
        if dist.is_initialized():
            dist.destroy_process_group()
        if _STATE is self:
            _STATE = None


def get_parallel_state() -> ParallelState | None:
    """This process's ``ParallelState``, or None in a process that never joined a world (one device)."""
    return _STATE


_SINGLE = {name: GroupCoordinator(name, [0], 0, 0, torch.device("cpu"), None, None)
           for name in ("tp", "pp", "dp", "ep")}


def get_tp_group() -> GroupCoordinator:
    """The tensor-parallel group of this process; a one-rank group (every collective a no-op) without a world."""
    return _SINGLE["tp"] if _STATE is None else _STATE.tp


@contextlib.contextmanager
def tp_layout_preview(tp_size: int, tp_rank: int = 0) -> Iterator[GroupCoordinator]:
    """Within the block, ``get_tp_group`` is rank ``tp_rank`` of ``tp_size`` ranks with no process group behind
    it, for building a model on the ``meta`` device to see what that rank would hold before any worker starts
    (a layer refuses a split it cannot take). Any collective called in the block fails.

    Raises:
        RuntimeError: the process already joined a world (its real groups are in use).
    """
    if _STATE is not None:
        raise RuntimeError("tp_layout_preview in a process that joined a world")
    single = _SINGLE["tp"]
    _SINGLE["tp"] = GroupCoordinator("tp", list(range(tp_size)), tp_rank, tp_rank, torch.device("meta"), None, None)
    try:
        yield _SINGLE["tp"]
    finally:
        _SINGLE["tp"] = single


def get_pp_group() -> GroupCoordinator:
    """The pipeline-parallel group of this process; a one-rank group without a world."""
    return _SINGLE["pp"] if _STATE is None else _STATE.pp


def get_dp_group() -> GroupCoordinator:
    """The data-parallel group of this process: the same shard of the same stage in every engine of a world
    that spans engines (expert parallelism across DP); a one-rank group without a world, or inside one
    engine's own world (its grid has one replica)."""
    return _SINGLE["dp"] if _STATE is None else _STATE.dp


def engine_world(parallel, engine_rank: int) -> tuple[RankGrid, int]:
    """The grid a worker of one engine joins and its global rank in it.

    Inside one engine (``data_parallel_lockstep`` off) the grid is that engine's ``1 x pp x tp`` and the global
    rank is ``engine_rank``; when the engines step in lockstep it is the ``dp x pp x tp`` grid of every engine,
    and engine ``d``'s rank ``r`` is global rank ``d * pp * tp + r`` (TP fastest, vLLM's layout).

    Args:
        parallel: the engine's ``ParallelConfig`` (its ``data_parallel_rank`` set by the front end).
        engine_rank: the worker's rank among its engine's ``tp * pp`` workers.
    """
    pp, tp = parallel.pipeline_parallel_size, parallel.tensor_parallel_size
    if not parallel.data_parallel_lockstep:
        return RankGrid(dp=1, pp=pp, tp=tp), engine_rank
    dp_rank = parallel.data_parallel_rank or 0
    return RankGrid(dp=parallel.data_parallel_size, pp=pp, tp=tp), dp_rank * pp * tp + engine_rank


def get_ep_group() -> GroupCoordinator:
    """The expert-parallel group of this process (the DP x TP ranks of its stage: inside one engine, whose grid
    has one replica, its TP ranks; across lockstep engines, every engine's); a one-rank group without a world."""
    return _SINGLE["ep"] if _STATE is None else _STATE.ep


def init_parallel_state(grid: RankGrid, rank: int, local_rank: int, device: torch.device, *, backend: str,
                        store_address: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> ParallelState:
    """Join the world as ``rank`` and build every group of ``grid``.

    Args:
        grid: the DP x PP x TP layout; its world size is the number of processes that call this.
        rank: this process's global rank.
        local_rank: its device index on its node (for ``cuda:<local_rank>``; logged, not used to place it).
        device: where its tensors live.
        backend: the ``torch.distributed`` backend of the world and the device groups: the platform's
            ``Platform.dist_backend`` ("nccl" on CUDA, "gloo" on the CPU; an out-of-tree platform names its own).
            The CPU groups are gloo whatever it is.
        store_address: ``HOST:PORT`` of the rendezvous store (``RendezvousStore``), the same for every rank.
        timeout_s: how long a collective may stall before it raises.
    Returns:
        The rank's ``ParallelState``.
    Raises:
        RuntimeError: the rendezvous or a group creation failed (from ``torch.distributed``).
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend=backend, store=connect_store(store_address, timeout_s),
                            world_size=grid.world_size, rank=rank, timeout=timeout)

    def build(name: str, groups: list[list[int]]) -> GroupCoordinator:
        mine = None
        for ranks in groups:  # every rank creates every group, in the same order
            cpu_group = dist.new_group(ranks, backend="gloo", timeout=timeout)
            device_group = cpu_group if backend == "gloo" else dist.new_group(ranks, backend=backend,
                                                                                timeout=timeout)
            if rank in ranks:
                mine = GroupCoordinator(name, ranks, rank, local_rank, device, cpu_group, device_group)
        assert mine is not None
        return mine

    world = GroupCoordinator("world", list(range(grid.world_size)), rank, local_rank, device,
                             dist.new_group(list(range(grid.world_size)), backend="gloo", timeout=timeout),
                             dist.GroupMember.WORLD)
    state = ParallelState(grid=grid, world=world, tp=build("tp", grid.tp_groups()), pp=build("pp", grid.pp_groups()),
                          dp=build("dp", grid.dp_groups()), ep=build("ep", grid.ep_groups()))
    global _STATE
    _STATE = state
    return state
