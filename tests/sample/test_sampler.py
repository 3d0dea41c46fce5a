"""Sampler.forward end to end: vLLM's order of steps, greedy, seeds, truncation supports, logprobs."""

import math

import pytest
import torch

from brigade.sample import LogitsProcessor, Sampler
from brigade.sample.logits_processors import LogitBiasLogitsProcessor
from brigade.sampling_params import SamplingParams

NEG_INF = float("-inf")


def draw(metadata_for, logits_row, params, *, rows=4000, seed=0, **kwargs):
    """The tokens drawn for ``rows`` identical rows, from the seeded default generator; [rows] int64."""
    torch.manual_seed(seed)
    logits = logits_row.repeat(rows, 1)
    md = metadata_for([params] * rows, vocab_size=logits.shape[1], **kwargs)
    return Sampler()(logits, md).sampled_token_ids


def test_greedy_is_argmax_and_input_untouched(metadata_for):
    logits = torch.randn(5, 50).to(torch.bfloat16)
    before = logits.clone()
    md = metadata_for([SamplingParams(temperature=0.0)] * 5, vocab_size=50)
    out = Sampler()(logits, md)
    assert torch.equal(out.sampled_token_ids, logits.float().argmax(dim=-1))
    assert out.sampled_token_ids.dtype == torch.int64 and out.logprobs is None
    assert torch.equal(logits, before)


def test_empty_batch(metadata_for):
    out = Sampler()(torch.zeros(0, 8), metadata_for([], vocab_size=8))
    assert out.sampled_token_ids.shape == (0,) and out.sampled_token_ids.dtype == torch.int64


def test_mixed_batch_greedy_rows_take_argmax(metadata_for):
    torch.manual_seed(0)
    logits = torch.randn(6, 30)
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.5, top_k=3) for i in range(6)]
    out = Sampler()(logits, metadata_for(params, vocab_size=30)).sampled_token_ids
    assert torch.equal(out[1::2], logits[1::2].argmax(dim=-1))


def test_seeded_row_reproducible_regardless_of_batch(metadata_for):
    torch.manual_seed(0)
    row = torch.randn(1, 64)
    seeded = SamplingParams(temperature=1.3, top_p=0.95, seed=1234)
    alone = Sampler()(row, metadata_for([seeded], vocab_size=64)).sampled_token_ids
    others = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.0), SamplingParams(seed=9, top_k=5)]
    draws = []
    for position in range(4):
        params = others[:position] + [seeded] + others[position:]
        logits = torch.randn(4, 64)
        logits[position] = row[0]
        torch.manual_seed(position)  # the default generator's state must not matter
        out = Sampler()(logits, metadata_for(params, vocab_size=64)).sampled_token_ids
        draws.append(out[position].item())
    assert draws == [alone.item()] * 4
    # Over several steps the seeded stream is one fixed sequence, and another seed gives another one.
    def stream(seed):
        md = metadata_for([SamplingParams(seed=seed)], vocab_size=64)
        flat = torch.zeros(1, 64)
        return [Sampler()(flat, md).sampled_token_ids.item() for _ in range(20)]
    assert stream(1) == stream(1) != stream(2)


def test_top_k_support(metadata_for):
    logits = torch.tensor([[2.0, 1.0, 0.5, 1.5, 0.0, -1.0]])
    got = draw(metadata_for, logits, SamplingParams(top_k=3))
    assert set(got.tolist()) == {0, 3, 1}


def test_top_p_support(metadata_for):
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    got = draw(metadata_for, logits, SamplingParams(top_p=0.75))
    assert set(got.tolist()) == {0, 1}
    freq = torch.bincount(got, minlength=4).float() / got.numel()
    assert abs(freq[0] - 0.5 / 0.8) < 0.03  # renormalised over the kept set


def test_min_p_support_is_taken_after_temperature(metadata_for):
    logits = torch.tensor([[0.0, -1.0, -3.0]])
    # At T = 1 token 1 has ratio e^-1 = 0.37 < 0.5 to the top: dropped.
    assert set(draw(metadata_for, logits, SamplingParams(min_p=0.5)).tolist()) == {0}
    # At T = 2 its ratio is e^-0.5 = 0.61: kept, so min_p saw the tempered distribution.
    assert set(draw(metadata_for, logits, SamplingParams(min_p=0.5, temperature=2.0)).tolist()) == {0, 1}


def test_allowed_token_ids_support(metadata_for):
    logits = torch.zeros(1, 10)
    assert set(draw(metadata_for, logits, SamplingParams(allowed_token_ids=[2, 7])).tolist()) == {2, 7}


def test_logit_bias_and_min_tokens_bind_greedy(metadata_for):
    logits = torch.tensor([[5.0, 4.0, 1.0], [5.0, 4.0, 1.0], [5.0, 4.0, 1.0]])
    params = [SamplingParams(temperature=0.0, logit_bias={2: 10.0}),
              SamplingParams(temperature=0.0, min_tokens=2), SamplingParams(temperature=0.0, min_tokens=2)]
    md = metadata_for(params, vocab_size=3, outputs=[[], [1], [1, 1]], eos_token_id=0)
    assert Sampler()(logits, md).sampled_token_ids.tolist() == [2, 1, 0]


def test_bad_words_multi_token_in_sampler(metadata_for):
    params = SamplingParams(temperature=0.0, bad_words=["ab"], bad_words_token_ids=[[3, 4]])
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0, 9.0, 1.0]]).repeat(2, 1)
    md = metadata_for([params, params], vocab_size=6, outputs=[[3], [4]])
    assert Sampler()(logits, md).sampled_token_ids.tolist() == [5, 4]


def test_grammar_bitmask_applies(metadata_for):
    md = metadata_for([SamplingParams(temperature=0.0)], vocab_size=40)
    md.grammar_bitmask = torch.tensor([[1 << 3, 0]], dtype=torch.int32)  # only token 3
    assert Sampler()(torch.randn(1, 40), md).sampled_token_ids.tolist() == [3]


def test_logprobs_come_from_raw_logits(metadata_for):
    torch.manual_seed(0)
    logits = torch.randn(3, 20)
    params = [SamplingParams(logprobs=3, temperature=0.5, presence_penalty=2.0, logit_bias={4: 50.0}),
              SamplingParams(logprobs=1, temperature=0.0, repetition_penalty=3.0),
              SamplingParams(top_k=2)]
    md = metadata_for(params, vocab_size=20, outputs=[[0, 1], [2], []], prompts=[[], [5], []])
    out = Sampler()(logits, md)
    raw = torch.log_softmax(logits, dim=-1)
    lp = out.logprobs
    assert lp.token_ids.shape == (3, 4)
    assert torch.equal(lp.token_ids[:, 0], out.sampled_token_ids)
    assert out.sampled_token_ids[0] == 4  # the bias decided the sample, but not the logprobs
    assert torch.allclose(lp.logprobs, raw.gather(1, lp.token_ids))
    assert torch.equal(lp.token_ids[:, 1:], raw.topk(3, dim=-1).indices)
    for row in range(3):
        sampled_lp = raw[row, out.sampled_token_ids[row]]
        assert lp.ranks[row] == 1 + int((raw[row] > sampled_lp).sum())


class ForbidZero(LogitsProcessor):
    """A stand-in plugin processor: rows with n == 2 never emit token 0."""

    name = "forbid_zero"

    @classmethod
    def needs(cls, params):
        return params.n == 2

    def apply(self, logits):
        logits[self.rows(), 0] = NEG_INF
        return logits


def test_plugin_processor_runs_and_builtins_are_not_doubled(metadata_for):
    sampler = Sampler([ForbidZero, LogitBiasLogitsProcessor])
    assert sampler.non_argmax_invariant_processors.count(LogitBiasLogitsProcessor) == 1
    assert sampler.non_argmax_invariant_processors[-1] is ForbidZero
    logits = torch.tensor([[3.0, 1.0, 0.0]] * 2)
    md = metadata_for([SamplingParams(temperature=0.0, n=2, logit_bias={2: 1.5}), SamplingParams(temperature=0.0)],
                      vocab_size=3)
    assert sampler(logits, md).sampled_token_ids.tolist() == [2, 0]


def test_penalties_come_before_temperature(metadata_for):
    """Penalties come before temperature, so they mean the same at every temperature.

    Two equal logits; token 0 already appeared, presence_penalty = 2, temperature = 2.
    Penalty then temperature: logits (-2, 0) / 2 = (-1, 0), so P(0) = 1 / (1 + e) = 0.269.
    Temperature then penalty would give (0, 0) / 2 - (2, 0) = (-2, 0), P(0) = 0.119.
    (The repetition penalty alone would not show it: dividing a logit's magnitude commutes with
    dividing by a positive temperature; the additive penalties do not.)
    """
    params = SamplingParams(temperature=2.0, presence_penalty=2.0)
    got = draw(metadata_for, torch.zeros(1, 2), params, rows=20000, outputs=[[0]] * 20000)
    p0 = (got == 0).float().mean().item()
    assert abs(p0 - 1 / (1 + math.e)) < 0.015
    assert abs(p0 - 1 / (1 + math.e ** 2)) > 0.1
    # And a greedy request honours the penalty too: it is applied before the greedy shortcut.
    greedy = draw(metadata_for, torch.tensor([[1.0, 0.0]]), SamplingParams(temperature=0.0, presence_penalty=2.0),
                     rows=1, outputs=[[0]])
    assert greedy.tolist() == [1]


@pytest.mark.parametrize("vocab", [128256, 49152, 151936, 50257, 1009])
def test_two_pass_argmax_equals_argmax_with_ties(vocab):
    """The accelerator argmax (segment maxima, then the best segment) gives torch's answer, first index on ties."""
    from brigade.sample.sampler import argmax_rows

    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(4, vocab, generator=gen)
    logits[1, 3] = logits[1, vocab - 1] = 50.0  # a tie across segments: the lower index wins
    logits[2, vocab // 2] = logits[2, vocab // 2 + 1] = 50.0  # a tie inside one segment
    logits[3] = 7.0  # all equal: index 0
    for dtype in (torch.float32, torch.bfloat16):
        x = logits.to(dtype)
        assert torch.equal(argmax_rows(x, two_pass=True), x.argmax(dim=-1))
