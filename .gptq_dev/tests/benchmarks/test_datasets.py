"""Benchmark request sets: exact random lengths, seeded reproducibility, the ShareGPT-like length mix."""

from __future__ import annotations

import statistics

import pytest

from brigade.benchmarks.datasets import (SHAREGPT_LIKE_MAX_LEN, SHAREGPT_LIKE_MIN_LEN, make_requests, prompt_vocab_size,
                                         random_requests, sharegpt_like_requests, token_counts)


def test_random_requests_have_exact_lengths_and_ids_in_vocab():
    requests = random_requests(5, 7, 3, vocab_size=11, seed=1)
    assert [r.prompt_len for r in requests] == [7] * 5
    assert [r.output_len for r in requests] == [3] * 5
    assert all(0 <= t < 11 for r in requests for t in r.prompt_token_ids)
    assert token_counts(requests) == (35, 15)


def test_seed_fixes_the_prompts_and_another_seed_changes_them():
    a = random_requests(3, 16, 4, vocab_size=1000, seed=5)
    assert a == random_requests(3, 16, 4, vocab_size=1000, seed=5)
    assert a != random_requests(3, 16, 4, vocab_size=1000, seed=6)


def test_sharegpt_like_lengths_are_long_tailed_with_the_documented_means():
    requests = sharegpt_like_requests(4000, vocab_size=100, seed=0)
    prompt = [r.prompt_len for r in requests]
    output = [r.output_len for r in requests]
    assert 185 <= statistics.mean(prompt) <= 215
    assert 165 <= statistics.mean(output) <= 195
    # long-tailed: the mean sits well above the median
    assert statistics.mean(prompt) > 1.2 * statistics.median(prompt)
    assert min(prompt + output) >= SHAREGPT_LIKE_MIN_LEN and max(prompt + output) <= SHAREGPT_LIKE_MAX_LEN
    assert max(prompt) == SHAREGPT_LIKE_MAX_LEN  # the clip is reached: the tail is real
    assert requests == sharegpt_like_requests(4000, vocab_size=100, seed=0)


def test_sharegpt_like_requests_fit_the_max_model_len():
    requests = sharegpt_like_requests(500, vocab_size=100, seed=3, max_model_len=256)
    assert all(r.prompt_len + r.output_len <= 256 and r.output_len >= 1 for r in requests)


def test_make_requests_rejects_unknown_datasets_and_too_long_random_requests():
    with pytest.raises(ValueError, match="unknown dataset"):
        make_requests("sharegpt", 1, input_len=4, output_len=4, vocab_size=10)
    with pytest.raises(ValueError, match="exceeds the max model length"):
        make_requests("random", 1, input_len=100, output_len=30, vocab_size=10, max_model_len=128)


def test_prompt_vocab_is_cut_to_the_tokenizer_the_server_checks_against():
    class Tokenizer:
        def __len__(self):
            return 259

    assert prompt_vocab_size(128256, Tokenizer()) == 259
    assert prompt_vocab_size(49152, None) == 49152
