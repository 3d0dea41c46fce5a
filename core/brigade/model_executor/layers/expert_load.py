"""ExpertLoad: how many tokens the router sent to each expert of each MoE layer, counted on the device.

An operator sees expert imbalance in ``/metrics`` (``brigade:moe_expert_tokens_total``, labels ``layer`` and
``expert``). The counts never cost a sync of their own: each MoE layer adds its routing into a device buffer
(``record``, a scatter-add CUDA graphs capture like any other kernel), the buffer only grows, and the model
runner copies it to the host with a step's samples, whose existing wait covers the copy
(``worker/expert_counts.py``); the difference from the last copy is what the step reports. This is the load
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

    def record(self, row: int, topk_ids: torch.Tensor) -> None:
        """Add one layer's routing. Args: row, the layer's row of ``counts``; topk_ids [T, top_k] int, global
        expert ids."""
        num_tokens, top_k = topk_ids.shape
        real = (torch.arange(num_tokens, device=topk_ids.device) < self.num_tokens).to(torch.int64)  # [T]
        ones = real[:, None].expand(num_tokens, top_k).reshape(-1)  # [T * k], no host sync (graph-safe)
        self.counts[row].scatter_add_(0, topk_ids.reshape(-1).long(), ones)

    def begin_step(self, num_tokens: int) -> None:
        """The next forward's real token count (no sync: a fill of a device scalar)."""
        self.num_tokens.fill_(num_tokens)

    def reset(self) -> None:
        """Forget what warm-up and profiling runs routed."""
        self.counts.zero_()
