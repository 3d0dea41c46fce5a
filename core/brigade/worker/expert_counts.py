"""ExpertCounts: the host side of a model's ``ExpertLoad``; what each step reports of it.

The device totals only grow. A step that samples starts a non-blocking copy of them to pinned host memory before
its sampled tokens' event is recorded (``snapshot``), so the wait ``SampledTokens.get()`` already does covers it;
``take`` then turns the copy into the tokens routed since the last report. Steps that sample nothing (prompt
chunks mid-prefill) report nothing: their tokens are in the next report.
"""

from __future__ import annotations

import torch

from brigade.model_executor.layers.expert_load import ExpertLoad


class ExpertCounts:
    """Reports a model's expert load step by step. Invariant: ``reported`` is the last totals ``take`` saw."""

    def __init__(self, load: ExpertLoad):
        self.load = load
        self.reported = torch.zeros(tuple(load.counts.shape), dtype=torch.int64)

    def reset(self) -> None:
        """Zero the device totals (after warm-up) and what was reported."""
        self.load.reset()
        self.reported.zero_()

    def snapshot(self) -> torch.Tensor:
        """Start copying the totals to the host without waiting; read the result only after the step's sync."""
        counts = self.load.counts
        if counts.device.type == "cpu":
            return counts.clone()
        host = torch.empty(tuple(counts.shape), dtype=counts.dtype, pin_memory=True)
        host.copy_(counts, non_blocking=True)
        return host

    def take(self, snapshot: torch.Tensor) -> dict[int, list[int]]:
        """Tokens routed to each expert since the last ``take``: decoder layer index -> [num_experts] counts.
        Call in step order, after the device reached the snapshot's copy."""
        delta = (snapshot - self.reported).tolist()
        self.reported = snapshot
        return dict(zip(self.load.layer_ids, delta))
