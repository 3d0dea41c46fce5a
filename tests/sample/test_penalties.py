"""apply_penalties against a per-element Python reference (CTRL repetition, OpenAI presence/frequency)."""

import torch

from brigade.sample.penalties import apply_penalties
from brigade.sampling_params import SamplingParams


def reference(logits, prompt, output, presence, frequency, repetition):
    result = []
    for token, x in enumerate(logits):
        if token in prompt or token in output:
            x = x / repetition if x > 0 else x * repetition
        count = output.count(token)
        x -= frequency * count + presence * (count > 0)
        result.append(x)
    return result


def test_penalties_match_reference(metadata_for):
    torch.manual_seed(0)
    vocab = 12
    logits = torch.randn(3, vocab) * 3
    params = [SamplingParams(repetition_penalty=1.5, presence_penalty=0.7, frequency_penalty=0.4),
              SamplingParams(repetition_penalty=0.8),
              SamplingParams(presence_penalty=-0.5, frequency_penalty=1.5)]
    prompts = [[0, 1, 1, 2], [3, 4], [5]]
    outputs = [[2, 2, 7, 11], [9, 9], [5, 5, 5, 6]]
    md = metadata_for(params, vocab_size=vocab, prompts=prompts, outputs=outputs)
    got = apply_penalties(logits.clone(), md.penalties)
    for row, p in enumerate(params):
        want = reference(logits[row].tolist(), prompts[row], outputs[row], p.presence_penalty,
                         p.frequency_penalty, p.repetition_penalty)
        assert torch.allclose(got[row], torch.tensor(want), atol=1e-6), row


def test_frequency_and_presence_use_only_output_tokens(metadata_for):
    md = metadata_for([SamplingParams(presence_penalty=1.0, frequency_penalty=0.5)], vocab_size=4,
                      prompts=[[0, 0, 0]], outputs=[[1, 1, 1, 2]])
    got = apply_penalties(torch.zeros(1, 4), md.penalties)
    # token 0 only in the prompt: untouched; token 1: 1 + 0.5 * 3; token 2: 1 + 0.5.
    assert got.tolist() == [[0.0, -2.5, -1.5, 0.0]]


def test_repetition_divides_positive_and_multiplies_negative(metadata_for):
    md = metadata_for([SamplingParams(repetition_penalty=2.0)], vocab_size=4, prompts=[[0]], outputs=[[1]])
    got = apply_penalties(torch.tensor([[4.0, -4.0, 4.0, -4.0]]), md.penalties)
    assert got.tolist() == [[2.0, -8.0, 4.0, -4.0]]


def test_only_the_rows_with_a_penalty_are_built_and_scored(metadata_for):
    torch.manual_seed(1)
    vocab = 10
    logits = torch.randn(4, vocab) * 3
    params = [SamplingParams(), SamplingParams(repetition_penalty=1.7, frequency_penalty=0.3), SamplingParams(),
              SamplingParams(presence_penalty=0.9)]
    prompts = [[0, 1], [2, 3, 3], [4], [5, 6]]
    outputs = [[1, 1], [3, 8, 8], [4, 4], [6, 9]]
    md = metadata_for(params, vocab_size=vocab, prompts=prompts, outputs=outputs)
    assert md.penalties.row_index.tolist() == [1, 3]
    assert md.penalties.output_token_counts.shape == (2, vocab)  # two rows counted, not four
    got = apply_penalties(logits.clone(), md.penalties)
    for row, p in enumerate(params):
        want = reference(logits[row].tolist(), prompts[row], outputs[row], p.presence_penalty,
                         p.frequency_penalty, p.repetition_penalty)
        assert torch.allclose(got[row], torch.tensor(want), atol=1e-6), row
    assert torch.equal(got[[0, 2]], logits[[0, 2]])  # rows without a penalty untouched
