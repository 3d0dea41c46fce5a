"""Benchmark request sets: random token-id prompts of fixed lengths, or a seeded ShareGPT-like length mix.

Prompts are token ids drawn uniformly from the vocabulary, as vLLM's ``random`` dataset does:
no tokenizer round trip, so the lengths are exact and the same ids go to Brigade, to the HF peer and
over HTTP. Nothing is downloaded; the ShareGPT-like set only imitates ShareGPT's long-tailed lengths.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from brigade.config import ConfigError

DATASETS = ("random", "sharegpt-like")

# ShareGPT-like lengths: lognormal (median, sigma), rounded and clipped to [MIN_LEN, MAX_LEN].
# With these parameters the clipped means are about 200 prompt and 180 output tokens
# (20k samples, seed 0: prompt mean 201, median 144, p99 1024 (clipped); output mean 180, median 132, p99 864).
SHAREGPT_LIKE_PROMPT = (144.0, 0.85)
SHAREGPT_LIKE_OUTPUT = (132.0, 0.80)
SHAREGPT_LIKE_MIN_LEN = 4
SHAREGPT_LIKE_MAX_LEN = 1024


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """One benchmark request: its prompt as token ids and how many tokens it must generate (ignore_eos)."""

    prompt_token_ids: list[int]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def _token_ids(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    return [rng.randrange(vocab_size) for _ in range(length)]


def random_requests(num_requests: int, input_len: int, output_len: int, *, vocab_size: int,
                    seed: int = 0) -> list[SampleRequest]:
    """``num_requests`` prompts of exactly ``input_len`` uniform random token ids, each asking ``output_len``.

    Raises:
        ValueError: a count or length below 1.
    """
    for name, value in (("num_requests", num_requests), ("input_len", input_len), ("output_len", output_len),
                        ("vocab_size", vocab_size)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    rng = random.Random(seed)
    return [SampleRequest(_token_ids(rng, input_len, vocab_size), output_len) for _ in range(num_requests)]


def _lognormal_len(rng: random.Random, median: float, sigma: float, max_len: int) -> int:
    value = round(rng.lognormvariate(math.log(median), sigma))
    return min(max_len, max(SHAREGPT_LIKE_MIN_LEN, value))


def sharegpt_like_requests(num_requests: int, *, vocab_size: int, seed: int = 0,
                           max_model_len: int | None = None) -> list[SampleRequest]:
    """Requests whose lengths follow a long-tailed, ShareGPT-like mix (seeded, synthetic).

    Prompt and output lengths are independent lognormals (median 144, sigma 0.85; median 132, sigma 0.8),
    rounded and clipped to [4, 1024]: means about 200 in and 180 out. When ``max_model_len`` is given,
    each output length is cut so that prompt + output fits.

    Raises:
        ValueError: ``num_requests`` below 1, or ``max_model_len`` too short for the shortest request.
    """
    if num_requests < 1:
        raise ValueError(f"num_requests must be at least 1, got {num_requests}")
    if max_model_len is not None and max_model_len < 2 * SHAREGPT_LIKE_MIN_LEN:
        raise ValueError(f"max_model_len {max_model_len} is too short for the sharegpt-like dataset")
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        prompt_len = _lognormal_len(rng, *SHAREGPT_LIKE_PROMPT, SHAREGPT_LIKE_MAX_LEN)
        output_len = _lognormal_len(rng, *SHAREGPT_LIKE_OUTPUT, SHAREGPT_LIKE_MAX_LEN)
        if max_model_len is not None:
            prompt_len = min(prompt_len, max_model_len - SHAREGPT_LIKE_MIN_LEN)
            output_len = min(output_len, max_model_len - prompt_len)
        requests.append(SampleRequest(_token_ids(rng, prompt_len, vocab_size), output_len))
    return requests


def check_random_lengths(input_len: int, output_len: int, max_model_len: int, source: str | None = None) -> None:
    """Refuse random requests longer than the model takes, in one line.

    Args:
        source: where ``max_model_len`` comes from (``--max-model-len``, the model's max_position_embeddings).
    Raises:
        ConfigError: naming both lengths, the limit and what would fit.
    """
    if input_len + output_len > max_model_len:
        where = f" ({source})" if source else ""
        raise ConfigError(f"--input-len {input_len} + --output-len {output_len} exceeds the max model length "
                          f"{max_model_len}{where}; keep their sum at most {max_model_len}")


def make_requests(dataset: str, num_requests: int, *, input_len: int, output_len: int, vocab_size: int,
                  seed: int = 0, max_model_len: int | None = None) -> list[SampleRequest]:
    """The request set named by ``--dataset``; ``input_len``/``output_len`` apply to ``random`` only.

    Raises:
        ValueError: an unknown dataset name, or a random request that does not fit ``max_model_len``.
    """
    if dataset == "random":
        if max_model_len is not None:
            check_random_lengths(input_len, output_len, max_model_len)
        return random_requests(num_requests, input_len, output_len, vocab_size=vocab_size, seed=seed)
    if dataset == "sharegpt-like":
        return sharegpt_like_requests(num_requests, vocab_size=vocab_size, seed=seed, max_model_len=max_model_len)
    raise ValueError(f"unknown dataset {dataset!r}; use one of {', '.join(DATASETS)}")


def prompt_vocab_size(model_vocab_size: int, tokenizer=None) -> int:
    """How many token ids the random prompts draw from: the model's vocabulary, cut to the tokenizer's
    length when there is a tokenizer (as vLLM's random dataset draws from the tokenizer), because the
    server refuses ids its tokenizer cannot decode. A dummy model with a small synthetic tokenizer
    therefore gets prompts over the tokenizer's ids only; for speed that changes nothing."""
    return model_vocab_size if tokenizer is None else min(model_vocab_size, len(tokenizer))


def token_counts(requests: list[SampleRequest]) -> tuple[int, int]:
    """(total prompt tokens, total requested output tokens)."""
    return sum(r.prompt_len for r in requests), sum(r.output_len for r in requests)
