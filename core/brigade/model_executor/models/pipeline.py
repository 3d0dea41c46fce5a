"""What a model needs to run one pipeline stage: its layer range, stand-ins for the other stages' layers, and
the tensors that travel between stages.

vLLM's scheme: stage ``s`` of ``pp`` builds only decoder layers ``pp_layer_range(L, s, pp)`` (the others are
``MissingLayer``s without parameters, so layer ``i`` keeps its name and its KV cache index); the first stage
embeds the tokens, the last applies the final norm and the LM head. A stage that is not the last returns its
residual stream as ``IntermediateTensors`` (``{"hidden_states": [T, hidden], "residual": [T, hidden]}``), which
the model runner sends to the next stage (``GroupCoordinator.send_tensor_dict``) and which the next stage's
forward starts from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from brigade.distributed import get_pp_group
from brigade.distributed.sharding import pp_layer_range

IntermediateTensors = dict[str, torch.Tensor]


class MissingLayer(nn.Identity):
    """The place of a layer another pipeline stage runs: no parameters, never called."""


@dataclass(frozen=True, slots=True)
class StageLayout:
    """This process's stage: its decoder layers ``[start, end)`` and whether it embeds or scores."""

    start: int
    end: int
    is_first: bool
    is_last: bool

    @classmethod
    def of(cls, num_layers: int) -> StageLayout:
        """The layout of this process's pipeline stage (the whole model without a pipeline group)."""
        pp = get_pp_group()
        start, end = pp_layer_range(num_layers, pp.rank_in_group, pp.world_size)
        return cls(start, end, pp.is_first_rank, pp.is_last_rank)

    def holds(self, layer_idx: int) -> bool:
        return self.start <= layer_idx < self.end


def stage_inputs(intermediate: IntermediateTensors | None, num_tokens: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The residual stream a later stage starts from: what the previous stage sent, or zeros ``[T, hidden]`` when
    nothing was (a profiling or warm-up run, which measures memory, not values)."""
    if intermediate is None:
        return torch.zeros(num_tokens, hidden_size, dtype=dtype, device=device), None
    return intermediate["hidden_states"], intermediate.get("residual")
