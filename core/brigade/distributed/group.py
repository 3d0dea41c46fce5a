"""GroupCoordinator: one parallel dimension's communicators, as seen from one rank.

Each group holds two ``torch.distributed`` process groups over the same ranks, as vLLM's does: a CPU group (gloo)
for Python objects and metadata, and a device group (NCCL on CUDA, gloo on the CPU) for tensors. Objects never go
through NCCL: a pickled object would cost device memory and could touch the wrong current device, and an NCCL
barrier is itself a broadcast of a device tensor. A group of one rank skips every collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(slots=True)
class TensorMeta:
    """What the receiver of ``send_tensor_dict`` needs to allocate one tensor before the data arrives."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class GroupCoordinator:
    """The ranks of one group (TP, PP, DP, EP or the world) and this rank's place in it.

    Invariants: ``ranks`` are global ranks in group order; ``rank_in_group`` indexes them; ``local_rank`` is the
    rank's device index on its node, which says nothing of its place in the group (on two nodes of two devices, a
    4-rank group's third member has ``local_rank`` 0 and ``rank_in_group`` 2).
    """

    def __init__(self, name: str, ranks: list[int], rank: int, local_rank: int, device: torch.device,
                 cpu_group: Any, device_group: Any):
        self.name = name  # "tp", "pp", "dp", "ep" or "world"
        self.ranks = list(ranks)
        self.rank = rank  # global rank
        self.local_rank = local_rank
        self.rank_in_group = self.ranks.index(rank)
        self.world_size = len(self.ranks)
        self.device = device
        self.cpu_group = cpu_group
        self.device_group = device_group

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    @property
    def next_rank(self) -> int:
        """The global rank after this one in the group (wrapping), where a pipeline stage sends."""
        return self.ranks[(self.rank_in_group + 1) % self.world_size]

    @property
    def prev_rank(self) -> int:
        """The global rank before this one in the group (wrapping), where a pipeline stage receives from."""
        return self.ranks[(self.rank_in_group - 1) % self.world_size]

    # ---- tensors, on the device group ------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the group, in place; returns it. Any shape and dtype."""
        if self.world_size > 1:
            dist.all_reduce(tensor, group=self.device_group)
        return tensor

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise maximum of ``tensor`` over the group, in place; returns it (a load-time statistic such
        as a weight scale's row maximum over the ranks' slices)."""
        if self.world_size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.device_group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along ``dim``, in group order.

        Args:
            tensor: the same shape on every rank.
        Returns:
            ``tensor``'s shape with ``dim`` multiplied by the group size.
        """
        if self.world_size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the group and keep this rank's slice of dim 0 (the inverse of ``all_gather`` on dim
        0): rank ``i`` gets rows ``[i * n, (i + 1) * n)`` of the sum, ``n = tensor.shape[0] // world_size``.

        Args:
            tensor: [world_size * n, ...], the same shape on every rank.
        Returns:
            [n, ...] in ``tensor``'s dtype.
        """
        if self.world_size == 1:
            return tensor
        out = torch.empty((tensor.shape[0] // self.world_size, *tensor.shape[1:]), dtype=tensor.dtype,
                          device=tensor.device)
        dist.reduce_scatter(out, list(tensor.contiguous().chunk(self.world_size)), group=self.device_group)
        return out

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite ``tensor`` on every member with the group's ``src`` member's, in place; returns it. The
        receivers allocate it with the sender's shape and dtype."""
        if self.world_size > 1:
            dist.broadcast(tensor, src=self.ranks[src], group=self.device_group)
        return tensor

    def send_tensor_dict(self, tensors: dict[str, torch.Tensor], dst: int | None = None) -> None:
        """Send named tensors to the group's ``dst`` member (default: the next rank): shapes and dtypes on the
        CPU group, then each tensor on the device group."""
        dst = self.next_rank if dst is None else self.ranks[dst]
        meta = {name: TensorMeta(tuple(t.shape), t.dtype) for name, t in tensors.items()}
        dist.send_object_list([meta], dst=dst, group=self.cpu_group)
        for tensor in tensors.values():
            dist.send(tensor.contiguous(), dst=dst, group=self.device_group)

    def recv_tensor_dict(self, src: int | None = None) -> dict[str, torch.Tensor]:
        """Receive what the group's ``src`` member (default: the previous rank) sent with ``send_tensor_dict``."""
        src = self.prev_rank if src is None else self.ranks[src]
        box: list[Any] = [None]
        dist.recv_object_list(box, src=src, group=self.cpu_group)
        out = {}
        for name, meta in box[0].items():
            out[name] = torch.empty(meta.shape, dtype=meta.dtype, device=self.device)
            dist.recv(out[name], src=src, group=self.device_group)
        return out

    # ---- objects, on the CPU group ---------------------------------------------------------------
    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """Send a picklable object from the group's ``src`` member to every member; returns it on each."""
        if self.world_size == 1:
            return obj
        box = [obj if self.rank_in_group == src else None]
        dist.broadcast_object_list(box, src=self.ranks[src], group=self.cpu_group)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every member's object, in group order."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def max_over_group(self, values: list[int]) -> list[int]:
        """The elementwise maximum of every member's ``values`` (the same length on each), on the CPU group: a
        per-step agreement on host-side sizes that must never wait on the device."""
        if self.world_size == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.cpu_group)
        return tensor.tolist()

    def barrier(self) -> None:
        """Wait for every member, on the CPU group (an NCCL barrier would allocate on the current device)."""
        if self.world_size > 1:
            dist.barrier(group=self.cpu_group)

    def destroy(self) -> None:
        """Destroy the device group, then the CPU group. Communicators built on top of them go first."""
        for group in dict.fromkeys((self.device_group, self.cpu_group)):  # one object when both are gloo
            if group is not None and group is not dist.GroupMember.WORLD:
                dist.destroy_process_group(group)
        self.device_group = self.cpu_group = None

    def __repr__(self) -> str:
        return f"GroupCoordinator({self.name}, ranks={self.ranks}, rank_in_group={self.rank_in_group})"
