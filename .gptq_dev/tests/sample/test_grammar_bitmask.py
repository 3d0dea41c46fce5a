"""apply_grammar_bitmask unpacks xgrammar's int32 bitmask exactly (bit j of word w = token 32w + j)."""

import pytest
import torch

from brigade.sample.structured import apply_grammar_bitmask, bitmask_width

NEG_INF = float("-inf")


def pack(allowed: list[set[int]], vocab_size: int) -> torch.Tensor:
    """Reference packing with Python ints; bit 31 becomes the int32 sign bit."""
    rows = []
    for tokens in allowed:
        words = [0] * bitmask_width(vocab_size)
        for t in tokens:
            words[t // 32] |= 1 << (t % 32)
        rows.append([w - (1 << 32) if w >= 1 << 31 else w for w in words])
    return torch.tensor(rows, dtype=torch.int32)


def test_only_allowed_tokens_survive():
    vocab = 70  # not a multiple of 32
    allowed = [{0, 31, 32, 63, 69}, set(range(70)), {5}]
    logits = torch.randn(3, vocab)
    got = apply_grammar_bitmask(logits.clone(), pack(allowed, vocab))
    for row, tokens in enumerate(allowed):
        kept = set(torch.nonzero(got[row] != NEG_INF).flatten().tolist())
        assert kept == tokens
        assert torch.equal(got[row, sorted(tokens)], logits[row, sorted(tokens)])


def test_full_mask_row_is_unchanged():
    logits = torch.randn(1, 40)
    assert torch.equal(apply_grammar_bitmask(logits.clone(), torch.full((1, 2), -1, dtype=torch.int32)), logits)


def test_rejects_wrong_dtype_or_rows():
    with pytest.raises(ValueError):
        apply_grammar_bitmask(torch.zeros(2, 40), torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError):
        apply_grammar_bitmask(torch.zeros(2, 40), torch.zeros(3, 2, dtype=torch.int32))


def test_matches_xgrammar_on_a_real_grammar():
    xgr = pytest.importorskip("xgrammar")
    vocab = ["a", "b", "c", "ab", "</s>"]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[4])
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_regex("ab"))
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    logits = torch.randn(1, len(vocab))
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bitmask)
    got = apply_grammar_bitmask(logits.clone(), bitmask)
    assert torch.equal(got, want)
    assert set(torch.nonzero(got[0] != NEG_INF).flatten().tolist()) == {0, 3}  # "a" or "ab"
