"""apply_top_k_top_p keeps exactly the reference sets, per row, with disabled rows untouched."""

import math

import pytest
import torch

from brigade.sample.topk_topp import apply_top_k_top_p, exponential_race_sample, inverse_cdf_sample, random_sample


def reference_keep(row: list[float], k: int, p: float) -> set[int]:
    order = sorted(range(len(row)), key=lambda i: -row[i])[:k]
    top = [row[i] for i in order]
    z = sum(math.exp(x) for x in top)
    kept, mass = set(), 0.0
    for i in order:
        kept.add(i)
        mass += math.exp(row[i]) / z
        if mass >= p:
            break
    return kept


def kept(logits: torch.Tensor) -> list[set[int]]:
    return [set(torch.nonzero(r > float("-inf")).flatten().tolist()) for r in logits]


def test_matches_reference_sets():
    torch.manual_seed(0)
    vocab = 40
    logits = torch.randn(6, vocab) * 2
    ks = [1, 5, 40, 40, 10, 3]
    ps = [1.0, 1.0, 0.5, 1.0, 0.8, 0.99]
    got = apply_top_k_top_p(logits.clone(), torch.tensor(ks), torch.tensor(ps))
    for row in range(6):
        assert kept(got[row:row + 1])[0] == reference_keep(logits[row].tolist(), ks[row], ps[row]), row
    # Kept tokens keep their values; a row with k = V and p = 1 is unchanged.
    finite = got > float("-inf")
    assert torch.equal(got[finite], logits[finite])
    assert torch.equal(got[3], logits[3])


def test_top_k_only_and_top_p_only():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0], [math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    assert kept(apply_top_k_top_p(logits.clone(), torch.tensor([2, 4]), None)) == [{0, 2}, {0, 1, 2, 3}]
    # p = 0.79: 0.5 + 0.3 reaches it, so exactly two tokens; p = 0.81 needs the third.
    assert kept(apply_top_k_top_p(logits.clone(), None, torch.tensor([1.0, 0.79]))) == [{0, 1, 2, 3}, {0, 1}]
    assert kept(apply_top_k_top_p(logits.clone(), None, torch.tensor([0.05, 0.81]))) == [{0}, {0, 1, 2}]


def test_no_truncation_returns_input():
    logits = torch.randn(2, 5)
    assert apply_top_k_top_p(logits, None, None) is logits


def _on_logits(draw):
    """The race and random_sample take logits; inversion takes probabilities."""
    return draw if draw is inverse_cdf_sample else (lambda probs, gens: draw(probs.log(), gens))


@pytest.mark.parametrize("draw", [exponential_race_sample, inverse_cdf_sample, random_sample])
def test_draw_follows_the_distribution(draw):
    torch.manual_seed(1)
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    draws = _on_logits(draw)(probs.repeat(40000, 1), {})
    freq = torch.bincount(draws, minlength=7).float() / draws.numel()
    assert torch.allclose(freq, probs, atol=0.01)
    assert freq[0] == freq[2] == freq[6] == 0.0  # zero-probability tokens, first, inner and last, never drawn


def test_inverse_cdf_never_draws_zero_probability_at_the_extremes():
    """U = 0 and U just under 1 are the edges of inversion: they must land on the first and last live ids."""
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]] * 2)
    assert set(inverse_cdf_sample(probs.clone(), {}).tolist()) <= {1, 3}
    # The two edges through the same clamp and search the sampler uses.
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    target = torch.minimum(torch.tensor([[0.0], [1.0]]) * total, torch.nextafter(total, torch.zeros_like(total)))
    assert torch.searchsorted(cdf, target, right=True).squeeze(1).tolist() == [1, 3]


@pytest.mark.parametrize("draw", [exponential_race_sample, inverse_cdf_sample])
def test_seeded_rows_use_their_own_generator(draw):
    draw = _on_logits(draw)
    probs = torch.softmax(torch.randn(3, 100), dim=-1)
    a = draw(probs.clone(), {1: torch.Generator().manual_seed(5)})
    torch.manual_seed(123)  # a different global state changes nothing for the seeded row
    b = draw(probs.clone(), {1: torch.Generator().manual_seed(5)})
    assert a[1] == b[1]
    c = draw(probs[[1]].clone(), {0: torch.Generator().manual_seed(5)})  # alone in its batch: same draw
    assert c[0] == a[1]


def test_a_row_of_nan_logits_stays_in_the_vocabulary_and_leaves_other_rows_alone():
    """Non-finite logits (a diverged LoRA adapter, say) make a row of NaN probabilities; its draw must still be
    a vocabulary id (an id past the end killed the engine at the next embedding lookup) and the other rows'
    seeded draws must not change."""
    vocab = 50
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(1))
    want = inverse_cdf_sample(logits[[0, 2]].softmax(-1), {0: torch.Generator().manual_seed(5),
                                                           1: torch.Generator().manual_seed(6)})
    logits[1] = float("nan")
    got = random_sample(logits.clone(), {0: torch.Generator().manual_seed(5), 2: torch.Generator().manual_seed(6)})
    assert 0 <= int(got[1]) < vocab
    assert got[[0, 2]].tolist() == want.tolist()
