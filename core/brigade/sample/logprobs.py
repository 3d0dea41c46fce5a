"""LogprobsTensors: top-k log-probabilities of the raw logits and the sampled token's rank.

Logprobs come from the raw model logits, before penalties, temperature or any processor, so what the
user sees is the model's own distribution (vLLM v1's contract, unlike v0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LogprobsTensors", "compute_logprobs", "gather_logprobs"]


@dataclass(slots=True)
class LogprobsTensors:
    """Log-probabilities of the sampled (or target) token and of the top-k tokens, per row.

    Attributes:
        token_ids: [B, k+1] int64; column 0 is the sampled token, columns 1..k the top-k, best first.
        logprobs: [B, k+1] f32, the matching log-probabilities of the raw logits.
        ranks: [B] int64, the rank of the column-0 token: 1 + the number of tokens with a strictly
            greater logprob (1 = the best).
    A row that asked for n < k logprobs uses columns ``[:n+1]``.
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    ranks: torch.Tensor


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax in fp32 of [N, V] logits of any dtype; returns [N, V] f32."""
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32)


def gather_logprobs(logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor) -> LogprobsTensors:
    """Pick the top ``num_logprobs`` and the given tokens' logprobs and ranks.

    Args:
        logprobs: [N, V] f32 from ``compute_logprobs``.
        num_logprobs: k >= 0, the number of top tokens to return.
        token_ids: [N] int64, the sampled (or, for prompt logprobs, the next prompt) tokens.

    Returns: LogprobsTensors with [N, k+1] ids and logprobs and [N] ranks.
    """
    token_ids = token_ids.to(torch.int64).unsqueeze(1)  # [N, 1]
    token_logprobs = logprobs.gather(1, token_ids)  # [N, 1]
    ranks = (logprobs > token_logprobs).sum(dim=-1) + 1
    top_logprobs, top_ids = logprobs.topk(num_logprobs, dim=-1)
    return LogprobsTensors(token_ids=torch.cat([token_ids, top_ids], dim=1),
                           logprobs=torch.cat([token_logprobs, top_logprobs], dim=1),
                           ranks=ranks)
