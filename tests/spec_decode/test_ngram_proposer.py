"""NgramProposer: the KMP search equals a brute-force longest-suffix lookup (most recent occurrence), and the
proposer's caps (vLLM's ngram method)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from brigade.spec_decode.ngram import NgramProposer, find_ngram_match


def brute_force(tokens: list[int], min_n: int, max_n: int) -> tuple[int, int]:
    total = len(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n:]
        for start in range(total - n - 1, -1, -1):  # most recent earlier occurrence first
            if tokens[start:start + n] == suffix:
                return n, start + n
    return 0, -1


def test_kmp_search_equals_brute_force():
    rng = random.Random(0)
    for _ in range(3000):
        tokens = [rng.randint(0, 3) for _ in range(rng.randint(0, 40))]
        min_n = rng.randint(1, 4)
        max_n = rng.randint(min_n, 6)
        got = find_ngram_match(np.asarray(tokens, dtype=np.int64), min_n, max_n)
        assert got == brute_force(tokens, min_n, max_n), (tokens, min_n, max_n)


def test_proposes_what_followed_the_longest_most_recent_match():
    proposer = NgramProposer(k=3, min_n=1, max_n=3)
    # suffix [1, 2, 3] occurred at 0..2 (followed by 9, 9) and [2, 3] later at 6..7 (followed by 5): longest wins.
    assert proposer.propose([1, 2, 3, 9, 9, 7, 2, 3, 5, 1, 2, 3]) == [9, 9, 7]
    # two occurrences of the same length: the most recent one.
    assert proposer.propose([4, 8, 4, 6, 4]) == [6, 4]
    assert proposer.propose([1, 2, 3, 4]) == [], "nothing repeats: no drafts"
    assert proposer.propose([1, 2, 1, 2, 1], max_drafts=1) == [2]
    assert proposer.propose([1, 2, 1, 2, 1], max_drafts=0) == []
    assert NgramProposer(k=4, min_n=3, max_n=4).propose([5, 6, 9, 5, 6]) == [], "below prompt_lookup_min"


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        NgramProposer(k=2, min_n=3, max_n=2)
