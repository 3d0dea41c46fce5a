"""The fused-sampler seam (``brigade.sample.fused``): which batches the Sampler hands to a platform's
one-pass sampler, and that everything else keeps the tensor-op path. A pure-Python sampler registered for
the "cpu" device type stands in for a platform's kernel (the CUDA kernel's own checks are in
tests/cuda/test_fused_sampler_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from brigade.sample import Sampler
from brigade.sample.fused import fused_sampler, register_fused_sampler, unregister_fused_sampler
from brigade.sampling_params import SamplingParams


@pytest.fixture
def calls():
    """Register a recording sampler for "cpu" (argmax of logits / T, no noise: enough to see it ran)."""
    seen = []

    def fn(logits, temperature, *, greedy):
        seen.append((greedy, None if temperature is None else temperature.tolist()))
        scaled = logits.float() if temperature is None else logits.float() / temperature[:, None]
        return scaled.argmax(dim=-1)

    register_fused_sampler("cpu", fn)
    try:
        yield seen
    finally:
        unregister_fused_sampler("cpu")
    assert fused_sampler("cpu") is None


@pytest.mark.parametrize("params,expect", [
    ([SamplingParams(temperature=0.0)] * 2, (True, None)),
    ([SamplingParams(temperature=0.0, top_k=5, seed=3)] * 2, (True, None)),  # greedy ignores truncation/seed
    ([SamplingParams()] * 2, (False, None)),  # temperature 1.0: no tensor at all
    ([SamplingParams(temperature=0.5), SamplingParams(temperature=2.0)], (False, [0.5, 2.0])),
], ids=["greedy", "greedy-with-random-only-options", "random-t1", "random-temperatures"])
def test_plain_batches_take_the_fused_sampler(calls, metadata_for, params, expect):
    logits = torch.randn(len(params), 40)
    out = Sampler()(logits, metadata_for(params, vocab_size=40))
    assert calls == [expect]
    assert out.logprobs is None and out.sampled_token_ids.shape == (len(params),)


@pytest.mark.parametrize("params", [
    [SamplingParams(temperature=0.0), SamplingParams()],  # mixed greedy and random
    [SamplingParams(seed=7)] * 2,  # a seeded row draws from its own generator
    [SamplingParams(top_p=0.9)] * 2,
    [SamplingParams(top_k=3)] * 2,
    [SamplingParams(min_p=0.1)] * 2,
    [SamplingParams(logprobs=2)] * 2,
    [SamplingParams(temperature=0.0, logit_bias={3: 5.0})] * 2,
    [SamplingParams(temperature=0.0, repetition_penalty=1.3)] * 2,
    [SamplingParams(temperature=0.0, bad_words_token_ids=[[4]])] * 2,
], ids=["mixed", "seeded", "top_p", "top_k", "min_p", "logprobs", "logit_bias", "penalty", "bad_words"])
def test_other_batches_keep_the_tensor_ops(calls, metadata_for, params):
    Sampler()(torch.randn(len(params), 40), metadata_for(params, vocab_size=40))
    assert calls == []


def test_a_second_platform_function_is_refused():
    register_fused_sampler("cpu", lambda *a, **k: None)
    try:
        with pytest.raises(ValueError, match="already registered for cpu"):
            register_fused_sampler("cpu", lambda *a, **k: None)
    finally:
        unregister_fused_sampler("cpu")
