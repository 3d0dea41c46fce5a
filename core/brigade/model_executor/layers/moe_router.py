"""The top-k softmax router of mixture-of-experts layers (Shazeer et al. 2017, "Outrageously Large Neural
Networks: The Sparsely-Gated Mixture-of-Experts Layer"; Mixtral's and Qwen-MoE's form).

The router is a linear layer ``[num_experts, hidden]`` (the checkpoint's ``gate.weight``, never quantized) whose
logits pick each token's experts. ``select_experts`` does what transformers' ``MixtralTopKRouter`` and
``Qwen2MoeTopKRouter`` / ``Qwen3MoeTopKRouter`` do: a softmax over all experts in fp32, the ``top_k`` largest
probabilities, and, when the config renormalises (always for Mixtral; ``norm_topk_prob`` for Qwen MoE), their
division by their sum so that each token's weights add up to one.
"""

from __future__ import annotations

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ``top_k`` experts and their weights.

    Args:
        router_logits: [num_tokens, num_experts], any float dtype (the gate's output in the model dtype).
        top_k: experts per token (``num_experts_per_tok``), 1 <= top_k <= num_experts.
        renormalize: divide the chosen probabilities by their sum (Mixtral; Qwen MoE's ``norm_topk_prob``).

    Returns:
        (topk_weights [num_tokens, top_k] float32, topk_ids [num_tokens, top_k] int64), by decreasing weight.
        Ties go to the lower expert id, as ``torch.topk`` breaks them, which is what transformers uses.
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [T, E]
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)  # [T, k], [T, k]
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids
