"""Top-k / top-p truncation and the sync-free random draw of the Sampler.

One sort-based implementation serves the whole batch: rows that do not use top-k carry k = V and rows
that do not use top-p carry p = 1, which keep every token.
"""

from __future__ import annotations

import torch

from brigade.sample.argmax import argmax_rows

__all__ = ["apply_top_k_top_p", "random_sample"]

_NEG_INF = float("-inf")


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    """Set to -inf every token outside the row's top-k and outside its top-p nucleus.

    Args:
        logits: [B, V] f32, already divided by temperature.
        top_k: [B] int64 in [1, V] (V = off) or None.
        top_p: [B] f32 in (0, 1] (1 = off) or None.

    Returns: [B, V] f32 (a new tensor when a truncation applies, else ``logits``).

    Top-k keeps tokens whose logit is at least the k-th largest (ties with it are kept). Top-p
    (Holtzman et al. 2019) keeps the smallest set of most likely tokens whose mass reaches p, computed
    after top-k; the most likely token is always kept.
    """
    if top_k is None and top_p is None:
        return logits
    vocab_size = logits.shape[-1]
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=False)  # [B, V] ascending
    if top_k is not None:
        kth_position = (vocab_size - top_k).clamp(0, vocab_size - 1).unsqueeze(1)  # [B, 1]
        kth_value = sorted_logits.gather(1, kth_position)
        sorted_logits.masked_fill_(sorted_logits < kth_value, _NEG_INF)
    if top_p is not None:
        # Ascending cumulative mass: a token is dropped when it and every less likely token together
        # hold no more than 1 - p, i.e. the tokens above it already reach p.
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1.0 - top_p).unsqueeze(1)
        drop[:, -1] = False
        sorted_logits.masked_fill_(drop, _NEG_INF)
    return torch.empty_like(logits).scatter_(1, sorted_ids, sorted_logits)


def random_sample(logits: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Draw one token per row from ``softmax(logits)`` without a device-to-host sync.

    Args:
        logits: [B, V] f32, already divided by temperature and truncated (-inf: never drawn); modified in
            place.
        generators: row -> generator for seeded rows; other rows use the default generator.

    Returns: [B] int64 sampled ids.

    On an accelerator, the exponential race (as vLLM does, instead of torch.multinomial which syncs):
    with E_i ~ Exp(1), argmax_i p_i / E_i is distributed as Categorical(p). On the CPU, where drawing
    B x V exponentials costs more than the rest of the sampler, inversion of the CDF: one uniform U per
    row and the first token whose cumulative probability exceeds U times the row's total. Either way a
    seeded row draws from its own generator only, so its sample depends only on its generator and its
    own probabilities, not on its position in the batch or on the other rows.
    """
    if logits.device.type == "cpu":
        return inverse_cdf_sample(logits.softmax(dim=-1), generators)
    return exponential_race_sample(logits, generators)


def exponential_race_sample(logits: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Categorical draw by the exponential race: [B, V] f32 logits (modified) -> [B] int64 ids.

    The race is run in log space, ``argmax_i (logit_i - log E_i)``, which picks the same token as
    ``argmax_i softmax(logits)_i / E_i`` without the softmax (two passes over the row), and its argmax is
    ``argmax_rows``'s: at batch 1 on a 128k vocabulary this is a few small kernels instead of two
    one-block row reductions (softmax and argmax) that dominate a fast decode step's sampling.
    """
    race = torch.empty_like(logits)
    if len(generators) < logits.shape[0]:
        race.exponential_()
    for row, generator in generators.items():
        race[row].exponential_(generator=generator)
    # An exact 0 draw would give log 0 = -inf, and -inf - (-inf) = NaN for a masked token (argmax favours
    # NaN); the clamp keeps every draw finite, so masked tokens stay at -inf.
    race.clamp_min_(torch.finfo(race.dtype).tiny).log_()
    return argmax_rows(logits.sub_(race))


def inverse_cdf_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Categorical draw by inversion: [B, V] probabilities (modified) -> [B] int64 ids.

    Zero-probability ids never win: the target is kept strictly below the row's total, and the search
    returns the first index whose cumulative sum is strictly above it, which is a step of the cdf.
    """
    cdf = probs.cumsum_(dim=-1)  # in place: probs is the caller's scratch
    uniform = torch.rand(probs.shape[0], 1, dtype=cdf.dtype, device=cdf.device)
    for row, generator in generators.items():
        uniform[row] = torch.rand(1, dtype=cdf.dtype, device=cdf.device, generator=generator)
    # right=True: the first index whose cdf is strictly above the target, so a token of zero
    # probability (a flat step of the cdf) is never chosen; U < 1 keeps the target under the total.
    total = cdf[:, -1:]
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    # A row of NaN probabilities (non-finite logits) searches past the end; the clamp keeps its id in the
    # vocabulary, so such a row gives a meaningless token instead of an index error that kills the engine.
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)
