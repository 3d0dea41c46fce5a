"""SamplingMetadata: the batched, per-step sampling state the stateless Sampler reads.

The Sampler is created once per engine while the batch changes every step, so all per-batch state is
built here, outside it (vLLM v1's "stateless Sampler + external metadata"). Building runs every step:
a feature that no row uses costs one Python comparison per row and no tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from brigade.sample.penalties import Penalties, add_counts, build_padded_token_ids, build_token_counts
from brigade.sample.transfer import to_device
from brigade.sampling_params import SamplingParams

__all__ = ["PendingTokens", "SamplingRequestState", "SamplingMetadata", "build_sampling_metadata",
           "reads_output_tokens"]


@dataclass(slots=True)
class SamplingRequestState:
    """One row of the batch, owned by the model runner.

    Attributes:
        params: the request's sampling parameters.
        prompt_token_ids: the prompt ids (repetition penalty looks at them).
        output_token_ids: the live list of sampled ids; the runner appends after each step.
        generator: the request's own generator when it has a seed (on the sampling device), else None.
        eos_token_id: the tokenizer's EOS id, masked by min_tokens (unless ignore_eos).
    """

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None
    eos_token_id: int | None


@dataclass(slots=True)
class PendingTokens:
    """The tokens of the step still in flight (overlapped scheduling): sampled, still on the device, not yet in
    the rows' ``output_token_ids``. At most one per row, since one step is in flight at a time.

    Attributes:
        token_ids: [N] int64 on the sampling device, the last step's samples.
        rows: per row of the batch, the index of its pending token in ``token_ids``, or None when it has none.
    """

    token_ids: torch.Tensor
    rows: list[int | None]


def reads_output_tokens(params: SamplingParams) -> bool:
    """Whether sampling a row with these params reads its earlier output tokens (penalties, bad words of several
    tokens, min_tokens): under overlapped scheduling it then needs the in-flight token (PendingTokens)."""
    return (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0 or params.repetition_penalty != 1.0
            or params.min_tokens > 0 or any(len(w) > 1 for w in params.bad_words_token_ids or ()))


@dataclass(slots=True)
class SamplingMetadata:
    """Batched sampling state for one step; B rows in the order of the logits.

    Attributes:
        temperature: [B] f32; greedy rows hold 1.0 so dividing by it is a no-op. None when no row needs
            scaling (all greedy, or every random row at temperature 1.0).
        all_greedy: every row is greedy (temperature < 1e-5): the Sampler only takes the argmax.
        all_random: no row is greedy.
        is_greedy: [B] bool, only in a mixed batch (neither all_greedy nor all_random), else None.
        top_p: [B] f32 (1.0 = off), None when no random row uses top-p.
        top_k: [B] int64 in [1, V] (V = off), None when no random row uses top-k.
        min_p: [B] f32 (0.0 = off), None when no random row uses min-p.
        generators: row -> the row's own generator, for seeded random rows only.
        max_num_logprobs: the largest ``logprobs`` any row asked for, or None if none asked.
        penalties: penalty tensors, or None when no row uses a penalty.
        params: the rows' SamplingParams, for logits processors to build their state from.
        output_token_ids: the rows' live output id lists (bad words and min_tokens read them).
        num_pending: per row, 1 when a token of the step in flight is not yet in its ``output_token_ids``, else 0;
            min_tokens counts it, and the penalties and bad words read its value in ``pending_token_ids``.
        pending_token_ids: [B] int64 on the device, each row's pending token (0 where ``num_pending`` is 0), or
            None when no row has one or no row reads its output tokens.
        eos_token_ids: the rows' EOS id (or None).
        vocab_size: V, the logits' last dimension.
        device: where the logits live.
        grammar_bitmask: [B, ceil(V/32)] int32 as xgrammar fills it (bit set = allowed), or None.
            The runner sets it after building; unconstrained rows hold -1 (all bits set).
        processor_errors: filled by the Sampler: row -> why a plugin's logits processor failed on it (one line
            naming the processor and its plugin). Such a row's sample is meaningless; its request must fail.
    """

    temperature: torch.Tensor | None
    all_greedy: bool
    all_random: bool
    is_greedy: torch.Tensor | None
    top_p: torch.Tensor | None
    top_k: torch.Tensor | None
    min_p: torch.Tensor | None
    generators: dict[int, torch.Generator]
    max_num_logprobs: int | None
    penalties: Penalties | None
    params: list[SamplingParams]
    output_token_ids: list[list[int]]
    num_pending: list[int]
    pending_token_ids: torch.Tensor | None
    eos_token_ids: list[int | None]
    vocab_size: int
    device: torch.device
    grammar_bitmask: torch.Tensor | None = None
    processor_errors: dict[int, str] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        """B, the number of rows (requests) in the batch."""
        return len(self.params)


def build_sampling_metadata(reqs: list[SamplingRequestState], *, vocab_size: int, device: torch.device,
                            pending: PendingTokens | None = None) -> SamplingMetadata:
    """Batch the rows' sampling parameters into tensors on ``device``.

    Args:
        reqs: one state per row, in the order of the logits' rows.
        vocab_size: V, the width of the logits.
        device: the logits' device; generators of seeded rows must live there too.
        pending: the in-flight step's tokens of the rows (overlapped scheduling), or None when there is none.

    Returns: a SamplingMetadata whose unused features are None (no tensor built).
    """
    params = [r.params for r in reqs]
    greedy = [p.greedy for p in params]
    all_greedy = all(greedy)
    all_random = not any(greedy)
    random_params = [p for p, g in zip(params, greedy) if not g]

    def row_tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
        return to_device(torch.tensor(values, dtype=dtype), device)  # pinned on CUDA: keeps overlap overlapped

    temperature = None
    if any(p.temperature != 1.0 for p in random_params):
        temperature = row_tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)], torch.float32)
    is_greedy = None if (all_greedy or all_random) else row_tensor(greedy, torch.bool)

    # Sampling truncations matter only to random rows; greedy rows get the "off" value.
    top_p = top_k = min_p = None
    if any(p.top_p < 1.0 for p in random_params):
        top_p = row_tensor([1.0 if g else p.top_p for p, g in zip(params, greedy)], torch.float32)
    if any(0 < p.top_k < vocab_size for p in random_params):
        top_k = row_tensor([vocab_size if g or p.top_k <= 0 else min(p.top_k, vocab_size)
                            for p, g in zip(params, greedy)], torch.int64)
    if any(p.min_p > 0.0 for p in random_params):
        min_p = row_tensor([0.0 if g else p.min_p for p, g in zip(params, greedy)], torch.float32)

    generators = {i: r.generator for i, (r, g) in enumerate(zip(reqs, greedy))
                  if r.generator is not None and not g}
    asked = [p.logprobs for p in params if p.logprobs is not None]
    max_num_logprobs = max(asked) if asked else None
    num_pending, pending_token_ids = _pending_rows(pending, params, len(reqs), device)

    return SamplingMetadata(
        temperature=temperature, all_greedy=all_greedy, all_random=all_random, is_greedy=is_greedy,
        top_p=top_p, top_k=top_k, min_p=min_p, generators=generators, max_num_logprobs=max_num_logprobs,
        penalties=_maybe_build_penalties(reqs, vocab_size=vocab_size, device=device, num_pending=num_pending,
                                         pending_token_ids=pending_token_ids),
        params=params, output_token_ids=[r.output_token_ids for r in reqs], num_pending=num_pending,
        pending_token_ids=pending_token_ids, eos_token_ids=[r.eos_token_id for r in reqs], vocab_size=vocab_size,
        device=device)


def _pending_rows(pending: PendingTokens | None, params: list[SamplingParams], num_rows: int,
                  device: torch.device) -> tuple[list[int], torch.Tensor | None]:
    """(num_pending per row, the rows' pending tokens gathered on the device or None). The gather is one small
    index copy and one device gather, no host sync; it is skipped when no row reads its output tokens."""
    if pending is None or not any(r is not None for r in pending.rows):
        return [0] * num_rows, None
    num_pending = [int(r is not None) for r in pending.rows]
    if not any(n and reads_output_tokens(p) for n, p in zip(num_pending, params)):
        return num_pending, None
    index = to_device(torch.tensor([0 if r is None else r for r in pending.rows], dtype=torch.int64), device)
    return num_pending, pending.token_ids[index]


def _maybe_build_penalties(reqs: list[SamplingRequestState], *, vocab_size: int, device: torch.device,
                           num_pending: list[int], pending_token_ids: torch.Tensor | None) -> Penalties | None:
    """Build the penalty tensors only if some row uses a penalty, for those rows only (a batch of 512 where 50 use
    one counts 50 rows' tokens, not 512), and only the kinds that are used. The output token counts include each
    row's pending token (overlapped scheduling), counted on the device."""
    used = [i for i, r in enumerate(reqs) if uses_penalty(r.params)]
    if not used:
        return None
    row_index = None
    if len(used) < len(reqs):
        row_index = to_device(torch.tensor(used, dtype=torch.int64), device)
        reqs, num_pending = [reqs[i] for i in used], [num_pending[i] for i in used]
        if pending_token_ids is not None:
            pending_token_ids = pending_token_ids[row_index]
    params = [r.params for r in reqs]
    use_additive = any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params)
    use_repetition = any(p.repetition_penalty != 1.0 for p in params)
    presence = frequency = repetition = prompt_ids = None
    if use_additive:
        presence = to_device(torch.tensor([p.presence_penalty for p in params], dtype=torch.float32), device)
        frequency = to_device(torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32), device)
    if use_repetition:
        repetition = to_device(torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32), device)
        prompt_ids = build_padded_token_ids([r.prompt_token_ids for r in reqs], pad_id=vocab_size,
                                            device=device)
    counts = build_token_counts([r.output_token_ids for r in reqs], vocab_size=vocab_size, device=device)
    if pending_token_ids is not None:
        rows = [row for row, n in enumerate(num_pending) if n]
        add_counts(counts, to_device(torch.tensor(rows, dtype=torch.int64), device), pending_token_ids)
    return Penalties(presence_penalties=presence, frequency_penalties=frequency,
                     repetition_penalties=repetition, prompt_token_ids=prompt_ids,
                     output_token_counts=counts, row_index=row_index)


def uses_penalty(params: SamplingParams) -> bool:
    """Whether a request's sampling applies a repetition, presence or frequency penalty."""
    return params.presence_penalty != 0.0 or params.frequency_penalty != 0.0 or params.repetition_penalty != 1.0
