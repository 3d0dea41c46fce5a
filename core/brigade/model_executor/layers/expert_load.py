"""ExpertLoad: how many tokens the router sent to each expert of each MoE layer, counted on the device.

An operator sees expert imbalance in ``/metrics`` (``brigade:moe_expert_tokens_total``, labels ``layer`` and
``expert``). The counts never cost a sync of their own: each MoE layer's router adds its routing into its row of a
device buffer (``TopKRouter``: a scatter-add, or atomics in brigade-cuda's router kernel, which CUDA graphs capture
like any other kernel), the buffer only grows, and the model runner copies it to the host with a step's samples,
whose existing wait covers the copy (``worker/expert_counts.py``); the difference from the last copy is what the
step reports. This is the load
vLLM's EPLB keeps per physical expert (``expert_load_pass``), summed instead of windowed.
"""

from __future__ import annotations

import torch
from torch import nn


class ExpertLoad(nn.Module):
    """Running totals ``counts`` [num_moe_layers, num_experts] int64 on the model's device: assignments (token,
    slot) routed to each global expert id since the counts were last reset; ``layer_ids`` [num_moe_layers] the
    decoder layer of each row.

    Invariant: only the first ``num_tokens`` rows of a step count (a replayed CUDA graph runs padded rows too);
    the model runner sets it before each forward (``begin_step``). Buffers are not persistent: not in the
    checkpoint, not in ``named_parameters``.
    """

    def __init__(self, layer_ids: list[int], num_experts: int):
        super().__init__()
        self.layer_ids = list(layer_ids)
        self.num_experts = num_experts
        self.register_buffer("counts", torch.zeros(len(layer_ids), num_experts, dtype=torch.int64), persistent=False)
        # Real tokens of the step (rows past it are graph padding); large until the runner sets it.
        self.register_buffer("num_tokens", torch.full((), 2 ** 62, dtype=torch.int64), persistent=False)

    def begin_step(self, num_tokens: int) -> None:
        """The next forward's real token count (no sync: a fill of a device scalar)."""
        self.num_tokens.fill_(num_tokens)

    def reset(self) -> None:
        """Forget what warm-up and profiling runs routed."""
        self.counts.zero_()
