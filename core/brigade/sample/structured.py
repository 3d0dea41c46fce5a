"""Structured output seam: apply an xgrammar-style token bitmask to the logits.

The grammar state machine advances on the CPU (xgrammar, wired elsewhere); each step it fills an int32
bitmask of shape [B, ceil(V/32)] in which bit j of word w allows token 32*w + j. The Sampler applies it
with the allowed-token and bad-word masks, before anything that reads the logits' values.
"""

from __future__ import annotations

import math

import torch

__all__ = ["apply_grammar_bitmask", "bitmask_width"]

_NEG_INF = float("-inf")


def bitmask_width(vocab_size: int) -> int:
    """Number of int32 words per row: ceil(V / 32)."""
    return math.ceil(vocab_size / 32)


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set to -inf every token whose bit is 0; in place, returns ``logits``.

    Args:
        logits: [B, V] f32.
        bitmask: [B, W] int32; a row of -1 (all bits set) leaves its row unchanged.

    Like xgrammar's own kernels, only the first min(V, 32*W) tokens are governed by the mask; the
    runner should size the mask from the logits' V so that padded vocabulary entries are covered.
    Raises: ValueError when the batch sizes differ or the dtype is not int32.
    """
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"grammar bitmask must be int32 [{logits.shape[0]}, W], "
                         f"got {bitmask.dtype} {list(bitmask.shape)}")
    num_rows, width = bitmask.shape
    covered = min(logits.shape[-1], 32 * width)
    bitmask = bitmask.to(logits.device, non_blocking=True)
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    # [B, W, 32] -> [B, 32 * W]; "& 1" undoes the sign extension of the arithmetic shift.
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(num_rows, 32 * width)[:, :covered]
    logits[:, :covered].masked_fill_(allowed == 0, _NEG_INF)
    return logits
