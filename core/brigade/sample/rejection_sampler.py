"""RejectionSampler: verifies draft tokens against the target model's distribution (speculative decoding).

Speculative sampling (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding",
arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318): a request with drafts d_1..d_k ran the
k + 1 tokens [last token, d_1..d_k] through the model in one pass, so row j of its logits is the target
distribution p_{j+1} of the token after d_j (row 0: after the last token). For j = 1..k in order:

* greedy request: d_j is accepted while it equals argmax p_j; at the first mismatch the argmax is emitted
  instead and the rest is dropped;
* random request: d_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)). The n-gram proposer is
  deterministic, so q_j is one-hot on d_j and the test is u < p_j(d_j) with u ~ U[0, 1). On rejection a
  token is drawn from the residual norm(max(0, p_j - q_j)), which for a one-hot q_j is p_j with d_j
  removed and renormalized.

When every draft is accepted, a bonus token is drawn from p_{k+1}. The emitted tokens are then distributed
exactly as tokens drawn one at a time from the target (the papers' theorem), whatever the drafts were.

The p_j are the Sampler's own (``Sampler.target_logits``: masks, logit bias, min_tokens, penalties,
temperature, min_p, top-k/top-p), with each row's output history extended by the drafts before it, so a
penalty or min_tokens sees what it would see one token at a time. Draws use the request's generator
(``seed``) when it has one, so seeded requests are reproducible run to run. Logprobs, when asked, are the
raw target logprobs of each emitted token, as without speculation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from brigade.sample.logprobs import LogprobsTensors, gather_logprobs
from brigade.sample.metadata import SamplingMetadata
from brigade.sample.sampler import Sampler, TargetLogits
from brigade.sample.topk_topp import random_sample

_NEG_INF = float("-inf")


@dataclass(slots=True)
class RejectionSamplerOutput:
    """Per request (in input order): its emitted tokens, accepted drafts then one more (1 to k + 1 ids).

    Attributes:
        token_ids: per request, the emitted ids.
        logprobs: [sum of emitted, 1 + max_num_logprobs] tensors over the emitted tokens, request after
            request in order, or None when no row asked for logprobs.
    """

    token_ids: list[list[int]]
    logprobs: LogprobsTensors | None


class RejectionSampler:
    """Stateless; wraps the Sampler whose processing defines the target distribution."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata,
                 draft_token_ids: list[list[int]]) -> RejectionSamplerOutput:
        """Verify each request's drafts and emit its tokens.

        Args:
            logits: [R, V] target logits, R = sum(len(d) + 1 for d in draft_token_ids): request i's rows are
                consecutive, row j scoring the token after its j-th input (a request without drafts has one).
            metadata: R rows in the same order; all rows of a request share its params and generator (the
                generator sits at the request's first row in ``metadata.generators``), and row j's output
                history ends with the request's first j drafts.
            draft_token_ids: per request, its drafts (possibly empty).
        Returns:
            RejectionSamplerOutput.
        Raises:
            ValueError: when R does not match the drafts.
        """
        starts = _row_starts(draft_token_ids, logits.shape[0], metadata.num_rows)
        target = self.sampler.target_logits(logits, metadata)
        greedy = target.greedy.tolist() if target.greedy is not None else None
        greedy_req = [metadata.params[s].greedy for s in starts]
        num_accepted = _num_accepted(target, metadata, starts, draft_token_ids, greedy_req, greedy)
        final = _final_tokens(target, metadata, starts, draft_token_ids, greedy_req, greedy, num_accepted)
        token_ids = [drafts[:a] + [f] for drafts, a, f in zip(draft_token_ids, num_accepted, final)]
        logprobs = None
        if target.raw_logprobs is not None:
            rows = [s + j for s, t in zip(starts, token_ids) for j in range(len(t))]
            flat = torch.tensor([t for ts in token_ids for t in ts], device=target.raw_logprobs.device)
            logprobs = gather_logprobs(target.raw_logprobs[rows], metadata.max_num_logprobs, flat)
        return RejectionSamplerOutput(token_ids=token_ids, logprobs=logprobs)


def _row_starts(draft_token_ids: list[list[int]], num_logits: int, num_metadata_rows: int) -> list[int]:
    """The first row of each request (1 + k rows a request with k drafts).

    Raises:
        ValueError: when the logits or metadata rows do not match the drafts.
    """
    starts, row = [], 0
    for drafts in draft_token_ids:
        starts.append(row)
        row += len(drafts) + 1
    if row != num_logits or row != num_metadata_rows:
        raise ValueError(f"{num_logits} logits rows and {num_metadata_rows} metadata rows for drafts that need {row}")
    return starts


def _num_accepted(target: TargetLogits, metadata: SamplingMetadata, starts: list[int],
                  draft_token_ids: list[list[int]], greedy_req: list[bool], greedy: list[int] | None) -> list[int]:
    """Per request, how many of its drafts are accepted: greedy requests compare with the argmax; random ones
    draw u < p_j(d_j) (the request's generator, when seeded)."""
    p_draft: list[float] = []
    if target.warped is not None:
        rows = [s + j for s, d, g in zip(starts, draft_token_ids, greedy_req) if not g for j in range(len(d))]
        ids = [t for d, g in zip(draft_token_ids, greedy_req) if not g for t in d]
        if rows:
            probs = target.warped[rows].softmax(dim=-1)  # [D, V]
            p_draft = probs.gather(1, torch.tensor(ids, device=probs.device)[:, None]).squeeze(1).tolist()
    num_accepted, next_p = [], 0
    for start, drafts, is_greedy in zip(starts, draft_token_ids, greedy_req):
        k = len(drafts)
        accepted = 0
        if is_greedy:
            while accepted < k and drafts[accepted] == greedy[start + accepted]:
                accepted += 1
        elif k:
            generator = metadata.generators.get(start)
            uniform = torch.rand(k, generator=generator, device=generator.device if generator else
                                 target.warped.device).tolist()
            while accepted < k and uniform[accepted] < p_draft[next_p + accepted]:
                accepted += 1
            next_p += k
        num_accepted.append(accepted)
    return num_accepted


def _final_tokens(target: TargetLogits, metadata: SamplingMetadata, starts: list[int],
                  draft_token_ids: list[list[int]], greedy_req: list[bool], greedy: list[int] | None,
                  num_accepted: list[int]) -> list[int]:
    """The last token of each request: greedy -> argmax at its row; random -> a draw from p at the first
    rejected row with the rejected draft removed, or from p_{k+1} (the bonus row) when all were accepted."""
    final_rows = [s + a for s, a in zip(starts, num_accepted)]
    final = [greedy[r] if g else -1 for r, g in zip(final_rows, greedy_req)] if greedy is not None \
        else [-1] * len(starts)
    random_reqs = [i for i, g in enumerate(greedy_req) if not g]
    if random_reqs:
        rows = [final_rows[i] for i in random_reqs]
        warped = target.warped[rows]  # advanced indexing: a copy, the draw may modify it
        for n, i in enumerate(random_reqs):
            if num_accepted[i] < len(draft_token_ids[i]):
                warped[n, draft_token_ids[i][num_accepted[i]]] = _NEG_INF
        generators = {n: metadata.generators[starts[i]] for n, i in enumerate(random_reqs)
                      if starts[i] in metadata.generators}
        # p_j(d_j) == 1 cannot be rejected, so a residual with no mass left never reaches the draw.
        for n, tok in enumerate(random_sample(warped, generators).tolist()):
            final[random_reqs[n]] = tok
    return final
