"""RankGrid: how a world of ranks splits into data, pipeline, tensor and expert parallel groups.

The layout is vLLM's ``initialize_model_parallel`` grid: ``arange(world_size).reshape(dp, pp, tp)`` with the
tensor-parallel dimension fastest, so the ranks of one TP group are contiguous (and on one node when a node holds
``tp`` or more devices). Each dimension's groups are the grid's lines along that dimension. The expert-parallel
group is not a dimension of its own: it reuses the DP x TP ranks of one pipeline stage, as vLLM's does.

Pure arithmetic, no ``torch.distributed``: the scheduler-side checks and the tests use it without processes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RankCoords:
    """Where one global rank sits in the grid."""

    dp_rank: int  # index of its data-parallel replica, 0 .. dp - 1
    pp_rank: int  # its pipeline stage, 0 .. pp - 1 (stage 0 embeds, the last stage samples)
    tp_rank: int  # its tensor-parallel shard, 0 .. tp - 1


@dataclass(frozen=True, slots=True)
class RankGrid:
    """A DP x PP x TP grid of ``dp * pp * tp`` global ranks, TP fastest.

    Raises:
        ValueError: a size below 1.
    """

    dp: int = 1  # data-parallel replicas
    pp: int = 1  # pipeline stages
    tp: int = 1  # tensor-parallel shards

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} size must be at least 1, got {getattr(self, name)}")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def rank(self, dp_rank: int, pp_rank: int, tp_rank: int) -> int:
        """The global rank at these coordinates."""
        return (dp_rank * self.pp + pp_rank) * self.tp + tp_rank

    def coords(self, rank: int) -> RankCoords:
        """The coordinates of a global rank.

        Raises:
            ValueError: ``rank`` outside ``0 .. world_size - 1``.
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        dp_pp, tp_rank = divmod(rank, self.tp)
        dp_rank, pp_rank = divmod(dp_pp, self.pp)
        return RankCoords(dp_rank, pp_rank, tp_rank)

    def tp_groups(self) -> list[list[int]]:
        """Ranks that shard one layer together: same replica, same stage; ``dp * pp`` groups of ``tp``."""
        return [[self.rank(d, p, t) for t in range(self.tp)] for d in range(self.dp) for p in range(self.pp)]

    def pp_groups(self) -> list[list[int]]:
        """Ranks that pass activations stage to stage: same replica, same shard; ``dp * tp`` groups of ``pp``."""
        return [[self.rank(d, p, t) for p in range(self.pp)] for d in range(self.dp) for t in range(self.tp)]

    def dp_groups(self) -> list[list[int]]:
        """Ranks holding the same shard of the same stage in each replica; ``pp * tp`` groups of ``dp``."""
        return [[self.rank(d, p, t) for d in range(self.dp)] for p in range(self.pp) for t in range(self.tp)]

    def ep_groups(self) -> list[list[int]]:
        """Ranks that share a stage's experts under expert parallelism: DP x TP of one stage; ``pp`` groups."""
        return [[self.rank(d, p, t) for d in range(self.dp) for t in range(self.tp)] for p in range(self.pp)]

    def group_of(self, groups: list[list[int]], rank: int) -> list[int]:
        """The group in ``groups`` that holds ``rank``."""
        for group in groups:
            if rank in group:
                return group
        raise ValueError(f"rank {rank} is in none of the groups {groups}")
