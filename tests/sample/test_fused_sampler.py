"""The fused-sampler seam (``brigade.sample.fused``): which batches the Sampler hands to a platform's
one-pass sampler, and that everything else keeps the tensor-op path. A pure-Python sampler registered as the
"cpu" platform's "fused_sampler" kernel stands in for a platform's kernel (the CUDA kernel's own checks are in
tests/cuda/test_fused_sampler_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from brigade.sample import Sampler
from brigade.plugins import DuplicateNameError
from brigade.plugins.kernels import add_kernel, registered_kernel
from brigade.plugins.registry import PluginSource, Registry
from brigade.sample.fused import fused_sampler
from brigade.sampling_params import SamplingParams


@pytest.fixture
def calls():
    """Register a recording sampler for "cpu" (argmax of logits / T, no noise: enough to see it ran)."""
    seen = []

    def fn(logits, temperature, *, greedy):
        seen.append((greedy, None if temperature is None else temperature.tolist()))
        scaled = logits.float() if temperature is None else logits.float() / temperature[:, None]
        return scaled.argmax(dim=-1)

    with registered_kernel("fused_sampler", "cpu", fn):
        assert fused_sampler("cpu") is fn
        yield seen
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
    registry = Registry("kernel", callable_values=True)
    add_kernel(registry, "fused_sampler", "cpu", lambda *a, **k: None, PluginSource("a", "vendor-a", "1"))
    with pytest.raises(DuplicateNameError, match="kernel 'fused_sampler@cpu' from plugin 'b'.*vendor-a"):
        add_kernel(registry, "fused_sampler", "cpu", lambda *a, **k: None, PluginSource("b", "vendor-b", "1"))


@pytest.mark.parametrize("vocab", [128256, 49152, 1000, 300])
def test_cuda_fused_sampler_compiles_once_per_variant(vocab):
    """The CUDA kernels' compile-time values (block, the row kernel's power of two) and the segment length's
    divisibility do not move with the batch size, so a server whose batch grows never stalls on a Triton
    compile; segments tile the vocabulary exactly, at most 256 per row."""
    from brigade_cuda.ops.sampling import BLOCK, _row_best_kernel, _segment_best_kernel, launch_config

    configs = {rows: launch_config(rows, vocab) for rows in (1, 2, 3, 5, 8, 64, 100, 512, 1024, 4096)}
    assert len({segs_p2 for _, _, segs_p2 in configs.values()}) == 1
    for rows, (seg_len, num_segs, segs_p2) in configs.items():
        assert seg_len % BLOCK == 0 and num_segs <= segs_p2 <= 256 and segs_p2 >= 2
        assert (num_segs - 1) * seg_len < vocab <= num_segs * seg_len
    assert configs[1][1] == min(256, -(-vocab // BLOCK))  # a single row spreads over as many programs as it can
    def unspecialized(kernel):  # Triton keeps names or argument indices depending on its version
        return {kernel.arg_names[a] if isinstance(a, int) else a for a in kernel.do_not_specialize}

    assert {"seed", "num_segs"} <= unspecialized(_segment_best_kernel)
    assert "num_segs" in unspecialized(_row_best_kernel)


def test_model_runner_warms_up_every_plain_kind(calls):
    """The runner's start-up warm-up reaches the platform's fused sampler once per kind of plain batch, with
    logits of the model's vocabulary and dtype, so its kernels compile before the first request."""
    from brigade.worker.model_runner import ModelRunner

    runner = ModelRunner.__new__(ModelRunner)  # only what warm_up_sampler reads; no model needed
    runner.sampler, runner.device, runner.dtype, runner.vocab_size = Sampler(), torch.device("cpu"), torch.bfloat16, 77
    runner.warm_up_sampler()
    assert calls == [(True, None), (False, None), (False, [pytest.approx(0.7)])]
