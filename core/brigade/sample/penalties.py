"""Penalties: the repetition (CTRL) and presence/frequency (OpenAI) adjustments of the logits.

Both run before the greedy shortcut and before temperature, so that a penalty means the same thing at
every temperature and greedy requests honour it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import torch

from brigade.sample.transfer import to_device

__all__ = ["Penalties", "add_counts", "apply_penalties", "build_token_counts", "build_padded_token_ids"]


@dataclass(slots=True)
class Penalties:
    """Penalty parameters of the rows of one batch that use a penalty (present only when at least one does).

    The tensors describe R rows: every row of the batch, or only ``row_index``'s (a batch where few requests use
    a penalty builds and scores only theirs: the counts are [R, V], not [B, V]).

    Attributes:
        presence_penalties: [R] f32, OpenAI presence penalty, or None when no row uses presence/frequency.
        frequency_penalties: [R] f32, OpenAI frequency penalty, or None together with presence_penalties.
        repetition_penalties: [R] f32, CTRL penalty (1.0 = off), or None when no row uses it.
        prompt_token_ids: [R, P] int64 prompt ids right-padded with ``vocab_size``; only with repetition.
        output_token_counts: [R, V] int32, how often each token occurs in the row's output so far.
        row_index: [R] int64 batch rows on the logits' device, or None when R is the whole batch.
    """

    presence_penalties: torch.Tensor | None
    frequency_penalties: torch.Tensor | None
    repetition_penalties: torch.Tensor | None
    prompt_token_ids: torch.Tensor | None
    output_token_counts: torch.Tensor
    row_index: torch.Tensor | None = None


def build_token_counts(token_ids: list[list[int]], *, vocab_size: int, device: torch.device) -> torch.Tensor:
    """Count each row's tokens without padding: one flat index_put_ with accumulate.

    Returns: [B, vocab_size] int32 on ``device``.
    """
    counts = torch.zeros(len(token_ids), vocab_size, dtype=torch.int32, device=device)
    lengths = [len(ids) for ids in token_ids]
    if sum(lengths) == 0:
        return counts
    flat = torch.tensor(list(chain.from_iterable(token_ids)), dtype=torch.int64)
    rows = torch.repeat_interleave(torch.arange(len(token_ids)), torch.tensor(lengths))
    ones = torch.ones(flat.numel(), dtype=torch.int32, device=device)
    counts.index_put_((to_device(rows, device), to_device(flat, device)), ones, accumulate=True)
    return counts


def add_counts(counts: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> None:
    """Count one more token in each of ``rows``: ``counts[r, token_ids[r]] += 1`` for r in rows, on the device
    (the tokens of a step still in flight under overlapped scheduling, never read on the host).

    Args:
        counts: [B, V] int32, updated in place.
        rows: [R] int64 row indices, on ``counts``' device, each at most once.
        token_ids: [B] int64, per row its token (read only at ``rows``).
    """
    ones = torch.ones(rows.numel(), dtype=counts.dtype, device=counts.device)
    counts.index_put_((rows, token_ids[rows]), ones, accumulate=True)


def build_padded_token_ids(token_ids: list[list[int]], *, pad_id: int, device: torch.device) -> torch.Tensor:
    """Right-pad ragged id lists into one tensor.

    Returns: [B, max_len] int64 on ``device``, padded with ``pad_id`` (at least one column).
    """
    max_len = max((len(ids) for ids in token_ids), default=0)
    padded = [ids + [pad_id] * (max_len - len(ids)) for ids in token_ids]
    if max_len == 0:
        padded = [[pad_id] for _ in token_ids]
    return to_device(torch.tensor(padded, dtype=torch.int64), device)


def apply_penalties(logits: torch.Tensor, penalties: Penalties) -> torch.Tensor:
    """Apply the penalties and return the penalised logits (possibly a new tensor).

    Args:
        logits: [B, V] f32.
        penalties: the penalty tensors of the batch's rows that use one (``row_index``), or of every row.

    Repetition (CTRL, Keskar et al. 2019, as vLLM applies it): for every token that occurs in the
    prompt or the output, a positive logit is divided by the penalty and a negative one multiplied.
    Presence and frequency (OpenAI): ``logit -= frequency * count + presence * (count > 0)`` over
    output tokens only.
    """
    if penalties.row_index is not None:  # only some rows: score those, then put them back (no host sync)
        logits[penalties.row_index] = _apply(logits[penalties.row_index], penalties)
        return logits
    return _apply(logits, penalties)


def _apply(logits: torch.Tensor, penalties: Penalties) -> torch.Tensor:
    """``apply_penalties`` on logits [R, V] whose rows are the penalties' rows."""
    vocab_size = logits.shape[-1]
    counts = penalties.output_token_counts  # [R, V] int32
    if penalties.repetition_penalties is not None:
        assert penalties.prompt_token_ids is not None
        # One spare column takes the padding id, then it is dropped.
        seen = torch.zeros(logits.shape[0], vocab_size + 1, dtype=torch.bool, device=logits.device)
        seen.scatter_(1, penalties.prompt_token_ids, True)
        seen = seen[:, :vocab_size] | (counts > 0)
        rep = penalties.repetition_penalties.unsqueeze(1)  # [B, 1]
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalised, logits)
    if penalties.frequency_penalties is not None:
        assert penalties.presence_penalties is not None
        logits -= penalties.frequency_penalties.unsqueeze(1) * counts
        logits -= penalties.presence_penalties.unsqueeze(1) * (counts > 0)
    return logits
