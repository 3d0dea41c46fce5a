"""NgramProposer: draft tokens by prompt lookup (n-gram matching), as vLLM v1's ``ngram`` method.

Prompt lookup decoding (A. Saxena, 2023, github.com/apoorvumang/prompt-lookup-decoding; vLLM's
``NgramProposer``): find the longest suffix of the request's tokens (prompt plus output), of
``min_n`` to ``max_n`` tokens, that also occurs earlier in those tokens, and propose the up to ``k`` tokens
that followed its most recent earlier occurrence. It needs no draft model; it pays off when the output
copies from the context (quoting, code edits, lists, repetition).

The search is KMP's failure function on the reversed tokens: with ``r = tokens[::-1]``, the suffix n-grams
of ``tokens`` are the prefixes of ``r``, and the prefix function of ``r`` at position ``i`` is the length of
the longest prefix of ``r`` that ends at ``i``, i.e. the longest suffix n-gram of ``tokens`` that also ends
at original index ``len - 1 - i`` + that length - 1. One pass, O(length) time and O(max_n) memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def find_ngram_match(tokens: np.ndarray, min_n: int, max_n: int) -> tuple[int, int]:
    """The longest suffix n-gram of ``tokens`` (``min_n <= n <= max_n``) that occurred earlier, and where.

    Args:
        tokens: [L] int token ids (prompt then output).
        min_n, max_n: n-gram lengths, 1 <= min_n <= max_n.
    Returns:
        (n, end): the match length and the index just past its most recent earlier occurrence (the first
        token to propose is ``tokens[end]``); (0, -1) when no suffix of at least ``min_n`` tokens repeats.
    """
    total = len(tokens)
    if total < min_n + 1:
        return 0, -1
    r = tokens[::-1].tolist()
    # lps[i] for i < max_n: the prefix function of r, capped at max_n (prefixes longer are never needed).
    lps = [0] * max_n
    best_n, best_i = 0, -1
    prev = 0
    i = 1
    while i < total:
        if r[i] == r[prev]:
            prev += 1
            # r[i - prev + 1 .. i] == r[0 .. prev - 1]: the suffix n-gram of length prev ends (in tokens) at
            # index total - 1 - (i - prev + 1) + ... ; the earliest i with the longest prev is the most
            # recent occurrence in the original order.
            if prev > best_n:
                best_n, best_i = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev:
            prev = lps[prev - 1]
        else:
            i += 1
    if best_n < min_n:
        return 0, -1
    # The match r[best_i - best_n + 1 .. best_i] is tokens[total - 1 - best_i .. total - 1 - best_i + best_n - 1].
    return best_n, total - best_i + best_n - 1


class NgramProposer:
    """Proposes up to ``k`` draft tokens per request from its own tokens (pure CPU, numpy).

    Args:
        k: ``num_speculative_tokens``, most drafts per request per step.
        min_n, max_n: ``prompt_lookup_min`` and ``prompt_lookup_max``.
    """

    def __init__(self, k: int, min_n: int, max_n: int):
        if not 1 <= min_n <= max_n or k < 1:
            raise ValueError(f"bad n-gram proposer settings k={k}, min_n={min_n}, max_n={max_n}")
        self.k = k
        self.min_n = min_n
        self.max_n = max_n

    @classmethod
    def from_config(cls, config) -> NgramProposer:
        """From a ``brigade.config.SpeculativeConfig``."""
        return cls(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)

    def propose(self, token_ids: Sequence[int], max_drafts: int | None = None) -> list[int]:
        """Draft tokens for one request.

        Args:
            token_ids: the request's prompt and output tokens so far.
            max_drafts: a cap below ``k`` (room left before max_tokens), or None.
        Returns:
            Up to ``min(k, max_drafts)`` token ids copied from after the match; [] when nothing matches.
        """
        k = self.k if max_drafts is None else min(self.k, max_drafts)
        if k <= 0:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        n, end = find_ngram_match(tokens, self.min_n, self.max_n)
        if n == 0:
            return []
        return tokens[end:end + k].tolist()
