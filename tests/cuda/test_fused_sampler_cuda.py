"""The CUDA fused sampler (``brigade_cuda/ops/sampling.py``) on the GPU: greedy equals ``torch.argmax``
exactly (ties to the lowest index, masked rows), random draws follow softmax(logits / T), never pick a
masked token, and repeat under ``torch.manual_seed``; the Sampler hands it plain batches on CUDA."""

from __future__ import annotations

import contextlib

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from brigade_cuda.ops.sampling import fused_sample  # noqa: E402


@pytest.mark.parametrize("rows,vocab", [(1, 128256), (3, 50257), (64, 32000), (300, 1000), (2, 7)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_greedy_equals_torch_argmax(rows, vocab, dtype):
    gen = torch.Generator(device="cuda").manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, device="cuda", generator=gen).to(dtype)
    if vocab > 10:
        logits[0, vocab // 3] = logits[0, vocab - 2] = 40.0  # a tie across segments: the lower index wins
    if rows > 1:
        logits[1] = float("-inf")  # a fully masked row: token 0, as torch.argmax
    before = logits.clone()
    assert torch.equal(fused_sample(logits, None, greedy=True), logits.float().argmax(dim=-1))
    assert torch.equal(logits, before)


@pytest.mark.parametrize("temperature", [None, 0.5, 2.0])
def test_random_draws_follow_the_distribution(temperature):
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.15, 0.05, 0.0], device="cuda")
    rows = 60000
    logits = probs.log().repeat(rows, 1)
    temp = None if temperature is None else torch.full((rows,), temperature, device="cuda")
    torch.manual_seed(0)
    ids = fused_sample(logits, temp, greedy=False)
    freq = torch.bincount(ids, minlength=7).float() / rows
    want = torch.softmax(probs.log() / (temperature or 1.0), dim=-1)
    assert torch.allclose(freq, want, atol=0.01), (freq, want)
    assert freq[0] == freq[2] == freq[6] == 0.0


@pytest.mark.parametrize("rows,calls,temperature", [(60000, 1, None), (4, 5000, 0.7)])
def test_random_draws_follow_the_distribution_across_blocks_and_segments(rows, calls, temperature):
    # Mass spread over one block, a second block, the ragged last one and (at 4 rows, 256 segments per
    # row) different segments must come out as softmax(logits / T), never on a masked token.
    vocab = 128256
    pos = [5, 200, 300, 450, 700, 40_000, 90_001, vocab - 1]
    probs = torch.tensor([0.2, 0.1, 0.1, 0.15, 0.1, 0.1, 0.1, 0.15], device="cuda")
    logits = torch.full((rows, vocab), float("-inf"), device="cuda", dtype=torch.bfloat16)
    logits[:, pos] = probs.log().to(torch.bfloat16)
    temp = None if temperature is None else torch.full((rows,), temperature, device="cuda")
    torch.manual_seed(1)
    ids = torch.cat([fused_sample(logits, temp, greedy=False) for _ in range(calls)])
    counts = torch.bincount(ids, minlength=vocab)
    assert counts.sum() == counts[pos].sum() == rows * calls  # never a masked token
    freq = counts[pos].float() / (rows * calls)
    want = torch.softmax(logits[0, pos].float() / (temperature or 1.0), dim=-1)
    assert torch.allclose(freq, want, atol=0.015), (freq, want)


def test_random_over_a_large_vocabulary_repeats_under_manual_seed():
    logits = torch.randn(4, 128256, device="cuda").to(torch.bfloat16)
    logits[0, 1234] = 60.0  # dominant: always drawn
    logits[:, 99] = float("-inf")  # masked: never drawn
    torch.manual_seed(5)
    a = fused_sample(logits, None, greedy=False)
    torch.manual_seed(5)
    b = fused_sample(logits, None, greedy=False)
    c = torch.stack([fused_sample(logits, None, greedy=False) for _ in range(200)])
    assert torch.equal(a, b) and a[0] == 1234
    assert not (c == 99).any() and (c[:, 0] == 1234).all()
    assert len(set(c[:, 1].tolist())) > 150  # fresh draws each call, spread over the vocabulary


def test_registered_unless_switched_off(monkeypatch, cuda_ops_registered):
    from brigade.sample.fused import fused_sampler
    from brigade_cuda import plugin

    def registered_ops():
        ops = []
        plugin.register_kernels(lambda op, platform, impl, **kw: ops.append(op))
        return ops

    monkeypatch.setenv("BRIGADE_CUDA_FUSED_SAMPLER", "0")
    assert "fused_sampler" not in registered_ops()
    monkeypatch.delenv("BRIGADE_CUDA_FUSED_SAMPLER", raising=False)
    assert "fused_sampler" in registered_ops()
    assert fused_sampler("cuda") is fused_sample


def test_the_sampler_uses_it_for_plain_batches(monkeypatch, request, cuda_ops_registered):
    from brigade.sample import Sampler
    from brigade.plugins.kernels import registered_kernel
    from brigade.sample.metadata import SamplingRequestState, build_sampling_metadata
    from brigade.sampling_params import SamplingParams

    seen = []
    stack = contextlib.ExitStack()
    request.addfinalizer(stack.close)
    stack.enter_context(registered_kernel("fused_sampler", "cuda", lambda *a, **kw: (seen.append(kw["greedy"]),
                                                                                     fused_sample(*a, **kw))[1]))

    def metadata(params):
        reqs = [SamplingRequestState(params=p, prompt_token_ids=[1], output_token_ids=[], eos_token_id=None,
                                     generator=None) for p in params]
        return build_sampling_metadata(reqs, vocab_size=1000, device=torch.device("cuda"))

    logits = torch.randn(3, 1000, device="cuda").to(torch.bfloat16)
    greedy = Sampler()(logits, metadata([SamplingParams(temperature=0.0)] * 3)).sampled_token_ids
    assert torch.equal(greedy, logits.float().argmax(dim=-1))
    Sampler()(logits, metadata([SamplingParams(temperature=0.7)] * 3))
    Sampler()(logits, metadata([SamplingParams(top_p=0.5)] * 3))  # not plain: the tensor ops
    assert seen == [True, False]
