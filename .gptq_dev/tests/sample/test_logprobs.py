"""gather_logprobs: column 0 is the token, the top-k follow best first, ranks count strictly better tokens."""

import torch

from brigade.sample.logprobs import compute_logprobs, gather_logprobs


def test_top_k_sampled_column_and_ranks():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.0], [0.0, 0.0, 5.0, 1.0, 2.0]])
    logprobs = compute_logprobs(logits)
    out = gather_logprobs(logprobs, 2, torch.tensor([2, 0]))
    assert out.token_ids[:, 0].tolist() == [2, 0]
    assert out.token_ids[1, 1:].tolist() == [2, 4]
    assert set(out.token_ids[0, 1:].tolist()) == {1, 3}  # tie at the top
    assert torch.equal(out.logprobs, logprobs.gather(1, out.token_ids))
    # rank = 1 + number of strictly greater logprobs; ties share the better rank.
    assert out.ranks.tolist() == [3, 4]
    assert out.token_ids.dtype == torch.int64 and out.ranks.dtype == torch.int64


def test_zero_logprobs_keeps_only_the_token():
    out = gather_logprobs(compute_logprobs(torch.randn(3, 7)), 0, torch.tensor([1, 2, 3]))
    assert out.token_ids.shape == (3, 1) and out.logprobs.shape == (3, 1)


def test_compute_logprobs_is_fp32_of_low_precision_input():
    logits = torch.randn(2, 11).to(torch.bfloat16)
    got = compute_logprobs(logits)
    assert got.dtype == torch.float32
    assert torch.allclose(got, torch.log_softmax(logits.float(), dim=-1))
