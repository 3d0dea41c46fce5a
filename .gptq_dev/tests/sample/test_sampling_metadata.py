"""build_sampling_metadata: tensors hold the right values, and unused features build nothing."""

import torch

from brigade.sampling_params import SamplingParams


def test_plain_batch_builds_no_optional_tensor(metadata_for):
    md = metadata_for([SamplingParams(), SamplingParams(temperature=0.0)], vocab_size=50)
    assert (md.all_greedy, md.all_random) == (False, False)
    assert md.is_greedy.tolist() == [False, True]
    assert md.temperature is None  # the random row is at temperature 1.0: nothing to divide
    md = metadata_for([SamplingParams(temperature=0.5), SamplingParams(temperature=0.0)], vocab_size=50)
    assert md.temperature.tolist() == [0.5, 1.0]  # greedy row holds 1.0: division is a no-op
    assert md.top_k is None and md.top_p is None and md.min_p is None
    assert md.penalties is None and md.max_num_logprobs is None and md.generators == {}


def test_all_greedy_skips_temperature(metadata_for):
    md = metadata_for([SamplingParams(temperature=0.0, top_k=3, seed=1)] * 2, vocab_size=50)
    assert md.all_greedy and not md.all_random
    assert md.temperature is None and md.is_greedy is None
    # Truncation and seeds only matter to random rows.
    assert md.top_k is None and md.generators == {}


def test_truncation_values_with_off_rows(metadata_for):
    params = [SamplingParams(temperature=0.5, top_k=5, top_p=0.9, min_p=0.2, seed=7),
              SamplingParams(temperature=1.0, top_k=-1),
              SamplingParams(temperature=0.0, top_k=3, top_p=0.5, min_p=0.5),
              SamplingParams(temperature=1.0, top_k=1000)]
    md = metadata_for(params, vocab_size=50)
    assert md.all_random is False
    assert md.temperature.tolist() == [0.5, 1.0, 1.0, 1.0]
    assert md.top_k.tolist() == [5, 50, 50, 50]  # off and greedy rows get V; k > V is clamped
    assert torch.allclose(md.top_p, torch.tensor([0.9, 1.0, 1.0, 1.0]))
    assert torch.allclose(md.min_p, torch.tensor([0.2, 0.0, 0.0, 0.0]))
    assert list(md.generators) == [0]


def test_logprobs_is_the_largest_request(metadata_for):
    md = metadata_for([SamplingParams(logprobs=0), SamplingParams(), SamplingParams(logprobs=5)], vocab_size=9)
    assert md.max_num_logprobs == 5


def test_penalty_tensors(metadata_for):
    params = [SamplingParams(presence_penalty=0.5), SamplingParams(repetition_penalty=1.3),
              SamplingParams(frequency_penalty=-1.0)]
    md = metadata_for(params, vocab_size=6, outputs=[[1, 1, 2], [], [5]], prompts=[[0], [3, 4, 4], []])
    pen = md.penalties
    assert pen.presence_penalties.tolist() == [0.5, 0.0, 0.0]
    assert pen.frequency_penalties.tolist() == [0.0, 0.0, -1.0]
    assert torch.allclose(pen.repetition_penalties, torch.tensor([1.0, 1.3, 1.0]))
    assert pen.prompt_token_ids.tolist() == [[0, 6, 6], [3, 4, 4], [6, 6, 6]]  # padded with V
    assert pen.output_token_counts.tolist() == [[0, 2, 1, 0, 0, 0], [0] * 6, [0, 0, 0, 0, 0, 1]]


def test_additive_penalties_alone_skip_prompt_ids(metadata_for):
    md = metadata_for([SamplingParams(frequency_penalty=0.3)], vocab_size=4, prompts=[[1, 2]])
    assert md.penalties.repetition_penalties is None and md.penalties.prompt_token_ids is None


def test_output_lists_are_live(metadata_for):
    out = [3]
    md = metadata_for([SamplingParams()], vocab_size=9, outputs=[out])
    out.append(4)
    assert md.output_token_ids[0] == [3, 4]
