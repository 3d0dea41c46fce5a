"""StepSampler: one token per sampling request of a step, with the step's grammar masks.

The ``Sampler`` runs the built-in logits processors and those plugins register
(``register_logits_processors``); a row a plugin's processor fails on is reported, not raised, so its
request fails alone and the engine goes on.
"""

from __future__ import annotations

import numpy as np
import torch

from brigade.interfaces import SchedulerOutput
from brigade.plugins import registries
from brigade.sample.metadata import PendingTokens, SamplingRequestState, build_sampling_metadata
from brigade.sample.sampler import Sampler, SamplerOutput


def plugin_sampler() -> Sampler:
    """A ``Sampler`` with the plugins' logits processors (it skips built-ins it runs anyway)."""
    processors = registries.logits_processors
    classes = {n: processors.get(n) for n in processors.names()}
    return Sampler(extra_logits_processors=list(classes.values()),
                   descriptions={cls: f"logits processor {n!r} from {processors.entry(n).source.describe()}"
                                 for n, cls in classes.items()})


def grammar_bitmask(scheduler_output: SchedulerOutput, row_req_ids: list[str],
                    device: torch.device) -> torch.Tensor | None:
    """The scheduler's bitmask rows spread over the sampling rows ([rows, ceil(V/32)] int32 on ``device``; a
    request's row repeated for each of its rows); unconstrained rows allow everything. None without grammars."""
    if scheduler_output.grammar_bitmask is None or not scheduler_output.structured_output_req_ids:
        return None
    rows = {rid: i for i, rid in enumerate(scheduler_output.structured_output_req_ids)}
    src = scheduler_output.grammar_bitmask
    full = np.full((len(row_req_ids), src.shape[1]), -1, dtype=np.int32)
    for row, rid in enumerate(row_req_ids):
        if rid in rows:
            full[row] = src[rows[rid]]
    return torch.from_numpy(full).to(device, non_blocking=True)


def row_errors(row_req_ids: list[str], processor_errors: dict[int, str]) -> dict[str, str]:
    """Request id -> why a plugin's logits processor failed on one of its rows (``SamplingMetadata``)."""
    return {row_req_ids[row]: why for row, why in sorted(processor_errors.items())}


class StepSampler:
    """Samples a step's logits rows, a row per sampling request."""

    def __init__(self, sampler: Sampler, device: torch.device):
        self.sampler = sampler
        self.device = device

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRequestState], req_ids: list[str],
                 scheduler_output: SchedulerOutput, pending: PendingTokens | None = None
                 ) -> tuple[SamplerOutput, dict[str, str]]:
        """Sample ``logits`` ([len(rows), vocab]) with each row's sampling state (and its token of the step in
        flight, ``pending``); returns the samples (left on the device) and the requests a plugin's logits
        processor failed on (id -> the error line)."""
        metadata = build_sampling_metadata(rows, vocab_size=logits.shape[-1], device=self.device, pending=pending)
        metadata.grammar_bitmask = grammar_bitmask(scheduler_output, req_ids, self.device)
        out = self.sampler(logits, metadata)
        return out, row_errors(req_ids, metadata.processor_errors)
