"""The rank grid and real gloo process groups: membership, collectives, stage-to-stage sends, teardown."""

from __future__ import annotations

import multiprocessing
import traceback

import pytest
import torch

from brigade.distributed import RankGrid, RendezvousStore, StatelessGroup, init_parallel_state


def test_grid_matches_vllm_layout():
    # vLLM's docstring example: 8 ranks, tp 2, pp 4 -> TP [0,1],[2,3],..., PP [0,2,4,6],[1,3,5,7]
    grid = RankGrid(dp=1, pp=4, tp=2)
    assert grid.tp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.pp_groups() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert grid.dp_groups() == [[r] for r in range(8)]
    assert grid.ep_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_grid_with_every_dimension():
    grid = RankGrid(dp=2, pp=2, tp=2)
    assert grid.world_size == 8
    assert grid.tp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.pp_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.dp_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid.ep_groups() == [[0, 1, 4, 5], [2, 3, 6, 7]]  # DP x TP ranks of each stage
    for rank in range(8):
        c = grid.coords(rank)
        assert grid.rank(c.dp_rank, c.pp_rank, c.tp_rank) == rank
    # every rank is in exactly one group of each dimension
    for groups in (grid.tp_groups(), grid.pp_groups(), grid.dp_groups(), grid.ep_groups()):
        assert sorted(r for g in groups for r in g) == list(range(8))


def test_grid_rejects_bad_sizes():
    with pytest.raises(ValueError, match="tp size must be at least 1"):
        RankGrid(tp=0)
    with pytest.raises(ValueError, match="outside a world of 4"):
        RankGrid(pp=2, tp=2).coords(4)


def _rank_main(rank: int, grid: RankGrid, store_address: str, results) -> None:
    try:
        state = init_parallel_state(grid, rank, local_rank=rank, device=torch.device("cpu"), backend="gloo",
                                    store_address=store_address, timeout_s=60)
        out = {"tp": state.tp.ranks, "pp": state.pp.ranks, "dp": state.dp.ranks, "ep": state.ep.ranks,
               "tp_rank": state.tp.rank_in_group, "pp_rank": state.pp.rank_in_group}
        # all-reduce over TP: sum of (rank + 1) over the TP group
        t = torch.full((3,), float(rank + 1))
        out["tp_sum"] = state.tp.all_reduce(t).tolist()
        out["tp_gather"] = state.tp.all_gather(torch.tensor([rank]), dim=0).tolist()
        out["tp_scatter"] = state.tp.reduce_scatter(torch.arange(4.0) + rank).tolist()  # summed, then split
        # a group outside the world, at the same store (lockstep engines beside their workers' world)
        out["stateless_max"] = StatelessGroup(store_address, "engines/", rank, grid.world_size,
                                              60).all_reduce_max([rank, -rank])
        out["tp_object"] = state.tp.broadcast_object({"from": rank} if state.tp.is_first_rank else None)
        out["world_objects"] = state.world.all_gather_object(rank * 10)
        # stage to stage: the first stage sends hidden states and a residual, the last receives them
        if state.pp.world_size > 1:
            if state.pp.is_first_rank:
                state.pp.send_tensor_dict({"hidden": torch.arange(6.0).reshape(2, 3) + rank,
                                           "ids": torch.tensor([rank], dtype=torch.int64)})
            elif state.pp.is_last_rank:
                got = state.pp.recv_tensor_dict()
                out["recv"] = {k: (v.tolist(), str(v.dtype)) for k, v in got.items()}
        state.world.barrier()
        state.destroy()
        out["destroyed"] = not torch.distributed.is_initialized()
        results.put((rank, out))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, traceback.format_exc()))


def _run_world(grid: RankGrid) -> dict[int, dict]:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    store = RendezvousStore()  # hosted here, as the executor hosts it
    procs = [ctx.Process(target=_rank_main, args=(r, grid, store.address, results))
             for r in range(grid.world_size)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for rank, out in got.items():
        assert isinstance(out, dict), f"rank {rank} failed:\n{out}"
    return got


def test_gloo_groups_pp2_tp2():
    grid = RankGrid(dp=1, pp=2, tp=2)
    got = _run_world(grid)
    for rank, out in got.items():
        c = grid.coords(rank)
        assert out["tp"] == grid.group_of(grid.tp_groups(), rank)
        assert out["pp"] == grid.group_of(grid.pp_groups(), rank)
        assert (out["tp_rank"], out["pp_rank"]) == (c.tp_rank, c.pp_rank)
        tp_sum = float(sum(r + 1 for r in out["tp"]))
        assert out["tp_sum"] == [tp_sum] * 3
        assert out["tp_gather"] == out["tp"]
        i, whole = out["tp_rank"], (2 * torch.arange(4.0) + sum(out["tp"])).tolist()
        assert out["tp_scatter"] == whole[2 * i:2 * i + 2]
        assert out["stateless_max"] == [3, 0]
        assert out["tp_object"] == {"from": out["tp"][0]}
        assert out["world_objects"] == [r * 10 for r in range(4)]
        assert out["destroyed"]
    # ranks 2 and 3 (stage 1) received from ranks 0 and 1 (stage 0, same TP shard)
    for last, first in ((2, 0), (3, 1)):
        hidden, dtype = got[last]["recv"]["hidden"]
        assert hidden == (torch.arange(6.0).reshape(2, 3) + first).tolist() and dtype == "torch.float32"
        assert got[last]["recv"]["ids"] == ([first], "torch.int64")


def test_teardown_destroys_every_group_before_the_world(monkeypatch):
    """A real one-rank gloo world: ``destroy`` takes each dimension's groups down (its device group before its CPU
    group: on gloo they are one object, destroyed once), then the world's, and leaves no state behind."""
    import torch.distributed as dist

    from brigade.distributed.state import get_parallel_state

    store = RendezvousStore()
    state = init_parallel_state(RankGrid(), 0, local_rank=0, device=torch.device("cpu"), backend="gloo",
                                store_address=store.address, timeout_s=30)
    names = {}
    for coordinator in (state.ep, state.dp, state.pp, state.tp, state.world):
        names.setdefault(id(coordinator.cpu_group), coordinator.name)
    real, order = dist.destroy_process_group, []

    def recording(group=None):
        order.append("the world" if group is None else names.get(id(group), "?"))
        real(group)

    monkeypatch.setattr(dist, "destroy_process_group", recording)
    try:
        state.destroy()
    finally:
        if dist.is_initialized():
            real()
    assert order == ["ep", "dp", "pp", "tp", "world", "the world"], order  # the world's CPU group, then the world
    assert not dist.is_initialized() and get_parallel_state() is None


def test_the_rendezvous_store_holds_its_port_from_the_start():
    """The executor's store listens from construction on a port the OS chose, so no other process can take the
    port between choosing and binding it (the EADDRINUSE start-up race of a probed free port); ranks connect."""
    import socket

    from brigade.distributed.rendezvous import connect_store

    store = RendezvousStore()
    host, _, port = store.address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError):
        other.bind((host, int(port)))
    client = connect_store(store.address, timeout_s=10)
    client.set("rank0", "here")
    assert connect_store(store.address, timeout_s=10).get("rank0") == b"here"
    store.close()


def test_an_engines_workers_join_their_own_world_or_with_lockstep_every_engines():
    from brigade.config import ParallelConfig
    from brigade.distributed import engine_world

    dense = ParallelConfig(data_parallel_size=2, tensor_parallel_size=2, data_parallel_rank=1)
    assert not dense.data_parallel_lockstep
    assert engine_world(dense, 1) == (RankGrid(dp=1, pp=1, tp=2), 1)  # engine 1's own world of two
    experts = ParallelConfig(data_parallel_size=2, tensor_parallel_size=2, data_parallel_rank=1,
                             enable_expert_parallel=True)
    assert experts.data_parallel_lockstep
    grid, rank = engine_world(experts, 1)
    assert (grid, rank) == (RankGrid(dp=2, pp=1, tp=2), 3)  # engine 1's TP rank 1 in the world of both
    assert grid.ep_groups() == [[0, 1, 2, 3]]
