"""Process groups for tensor, pipeline, data and expert parallelism over ``torch.distributed``."""

from brigade.distributed.grid import RankCoords, RankGrid
from brigade.distributed.group import GroupCoordinator
from brigade.distributed.rendezvous import RendezvousStore, StatelessGroup
from brigade.distributed.state import (ParallelState, engine_world, get_dp_group, get_ep_group, get_parallel_state,
                                       get_pp_group, get_tp_group, init_parallel_state, tp_layout_preview)

__all__ = ["GroupCoordinator", "ParallelState", "RankCoords", "RankGrid", "RendezvousStore", "StatelessGroup",
           "engine_world", "get_dp_group", "get_ep_group", "get_parallel_state", "get_pp_group", "get_tp_group",
           "init_parallel_state", "tp_layout_preview"]
