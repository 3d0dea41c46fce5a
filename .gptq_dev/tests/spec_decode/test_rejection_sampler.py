"""RejectionSampler on synthetic logits: greedy verification, and for random sampling the emitted tokens are
distributed as the target (Leviathan et al. 2023, arXiv:2211.17192), for drafts mostly accepted and drafts
mostly rejected, after the Sampler's own temperature and top-k; seeded requests are reproducible."""

from __future__ import annotations

import numpy as np
import torch

from brigade.sample.metadata import SamplingRequestState, build_sampling_metadata
from brigade.sample.rejection_sampler import RejectionSampler
from brigade.sample.sampler import Sampler
from brigade.sampling_params import SamplingParams

V = 6


def run(logits_per_req: list[torch.Tensor], drafts: list[list[int]], params: list[SamplingParams],
        seeds: list[int | None] | None = None):
    """One call: request i has rows logits_per_req[i] ([k_i + 1, V])."""
    rows = []
    for i, (d, p) in enumerate(zip(drafts, params)):
        gen = None
        if seeds is not None and seeds[i] is not None:
            gen = torch.Generator().manual_seed(seeds[i])
        for j in range(len(d) + 1):
            rows.append(SamplingRequestState(params=p, prompt_token_ids=[0], output_token_ids=list(d[:j]),
                                             generator=gen, eos_token_id=None))
    md = build_sampling_metadata(rows, vocab_size=V, device=torch.device("cpu"))
    return RejectionSampler(Sampler())(torch.cat(logits_per_req), md, drafts)


def test_greedy_accepts_while_drafts_equal_the_argmax():
    logits = torch.tensor([[0, 5, 0, 0, 0, 0], [0, 0, 5, 0, 0, 0], [0, 0, 0, 5, 0, 0], [5, 0, 0, 0, 0, 0.]])
    greedy = SamplingParams(temperature=0.0)
    out = run([logits, logits, logits[:1]], [[1, 2, 3], [1, 4, 3], []], [greedy] * 3)
    assert out.token_ids[0] == [1, 2, 3, 0], "all accepted, then the bonus argmax"
    assert out.token_ids[1] == [1, 2], "second draft rejected: the target's argmax instead"
    assert out.token_ids[2] == [1], "no drafts: the plain argmax"


def test_logprobs_are_the_targets_for_each_emitted_token():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    greedy = SamplingParams(temperature=0.0, logprobs=2)
    top = logits.argmax(-1).tolist()
    out = run([logits], [[top[0], (top[1] + 1) % V]], [greedy])
    assert out.token_ids == [[top[0], top[1]]]
    expected = torch.log_softmax(logits, -1)
    got = out.logprobs.logprobs[:, 0]
    assert torch.allclose(got, torch.stack([expected[0, top[0]], expected[1, top[1]]]))
    assert out.logprobs.ranks.tolist() == [1, 1]


def _empirical(tokens: list[int]) -> np.ndarray:
    return np.bincount(np.asarray(tokens), minlength=V) / len(tokens)


def _assert_close(freq: np.ndarray, p: np.ndarray, n: int, what: str):
    tol = 5 * np.sqrt(p * (1 - p) / n) + 2e-3  # five standard errors per token
    assert np.all(np.abs(freq - p) <= tol), f"{what}: {freq.round(4)} vs {p.round(4)} (n={n})"


def test_random_sampling_matches_the_target_distribution():
    torch.manual_seed(0)
    base = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0], [0.0, 1.0, 2.0, 0.3, -0.5, 1.2],
                         [1.0, 0.0, 0.0, 2.0, 0.5, 0.2]])
    params = SamplingParams(temperature=0.8, top_k=4)
    # The target is the Sampler's: temperature then top-k.
    scaled = base / 0.8
    kth = scaled.topk(4, dim=-1).values[:, -1:]
    target = torch.softmax(scaled.masked_fill(scaled < kth, float("-inf")), -1).numpy()
    n = 6000
    for drafts, what in (([0, 2], "likely drafts, mostly accepted"), ([5, 4], "drafts outside top-k: always rejected"),
                         ([3, 1], "unlikely drafts, mostly rejected")):
        out = run([base] * n, [drafts] * n, [params] * n)
        first = [t[0] for t in out.token_ids]
        _assert_close(_empirical(first), target[0], n, f"{what}, first token")
        second = [t[1] for t in out.token_ids if t[0] == drafts[0]]  # after an accepted first draft: p_2
        if len(second) > 500:
            _assert_close(_empirical(second), target[1], len(second), f"{what}, second token")
        accepted = sum(t[0] == drafts[0] and len(t) > 1 for t in out.token_ids) / n
        assert abs(accepted - target[0][drafts[0]]) < 5 * np.sqrt(0.25 / n) + 1e-3, "P(accept d1) = p_1(d1)"
        bonus = [t[2] for t in out.token_ids if len(t) == 3]  # both accepted: the bonus is drawn from p_3
        if len(bonus) > 500:
            _assert_close(_empirical(bonus), target[2], len(bonus), f"{what}, bonus token")


def test_seeded_requests_are_reproducible():
    base = torch.randn(4, V, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=1.0, seed=7)
    drafts = [[int(base[0].argmax()), 1, 2]] * 8
    first = run([base] * 8, drafts, [params] * 8, seeds=list(range(8)))
    torch.manual_seed(123)  # the global generator must not matter to seeded rows
    second = run([base] * 8, drafts, [params] * 8, seeds=list(range(8)))
    assert first.token_ids == second.token_ids
    assert len({tuple(t) for t in first.token_ids}) > 1, "different seeds give different draws"
