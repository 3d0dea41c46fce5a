"""Row-wise argmax fast on accelerators for few rows (the greedy pick and the random draw's race)."""

from __future__ import annotations

import torch

__all__ = ["argmax_rows"]

# A vocabulary split into at most this many segments for the two-pass argmax below.
_ARGMAX_SEGMENTS = 256


def argmax_rows(logits: torch.Tensor, *, two_pass: bool | None = None) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` for [B, V] logits, in two passes on accelerators when rows are few.

    PyTorch reduces each row of an argmax in one thread block, so one 128k-vocabulary row costs about the time of
    a whole decoder layer (``docs/performance-notes.md``). Splitting the row
    into S equal segments (S the largest divisor of V up to 256) gives S-fold parallelism: the max of every
    segment, then the best segment. Ties resolve to the lowest index, as ``argmax`` does, because both
    passes return the first maximum. ``two_pass`` forces the choice (default: on accelerators at <= 8 rows).
    Returns [B] int64.
    """
    rows, vocab = logits.shape
    if two_pass is None:
        two_pass = logits.device.type != "cpu" and rows <= 8
    if not two_pass:
        return logits.argmax(dim=-1)
    segments = next((s for s in range(min(_ARGMAX_SEGMENTS, vocab // 64), 15, -1) if vocab % s == 0), 0)
    if not segments:
        return logits.argmax(dim=-1)
    best, where = logits.view(rows, segments, vocab // segments).max(dim=-1)  # [B, S] each
    segment = best.argmax(dim=-1, keepdim=True)  # [B, 1]
    return (segment * (vocab // segments) + where.gather(1, segment)).squeeze(1)
