"""The top-k softmax router of mixture-of-experts layers (Shazeer et al. 2017, "Outrageously Large Neural
Networks: The Sparsely-Gated Mixture-of-Experts Layer"; Mixtral's and Qwen-MoE's form).

The router is a linear layer ``[num_experts, hidden]`` (the checkpoint's ``gate.weight``, never quantized) whose
logits pick each token's experts. ``select_experts`` does what transformers' ``MixtralTopKRouter`` and
``Qwen2MoeTopKRouter`` / ``Qwen3MoeTopKRouter`` do: a softmax over all experts in fp32, the ``top_k`` largest
probabilities, and, when the config renormalises (always for Mixtral; ``norm_topk_prob`` for Qwen MoE), their
division by their sum so that each token's weights add up to one. gpt-oss's router (``GptOssTopKRouter``) takes
the ``top_k`` largest logits first and a softmax over those alone (``softmax_after_topk``): the same weights as a
renormalised softmax-then-top-k in exact arithmetic, computed as transformers computes them.
"""

from __future__ import annotations

import torch

from brigade.model_executor.layers.custom_op import CustomOp


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool, softmax_after_topk: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ``top_k`` experts and their weights.

    Args:
        router_logits: [num_tokens, num_experts], any float dtype (the gate's output in the model dtype).
        top_k: experts per token (``num_experts_per_tok``), 1 <= top_k <= num_experts.
        renormalize: divide the chosen probabilities by their sum (Mixtral; Qwen MoE's ``norm_topk_prob``).
        softmax_after_topk: the ``top_k`` largest logits, then a softmax over them (gpt-oss); ``renormalize``
            is then moot (the weights sum to one).

    Returns:
        (topk_weights [num_tokens, top_k] float32, topk_ids [num_tokens, top_k] int64), by decreasing weight.
        Ties go to the lower expert id, as ``torch.topk`` breaks them, which is what transformers uses.
    """
    if softmax_after_topk:
        top_logits, topk_ids = torch.topk(router_logits, top_k, dim=-1)  # [T, k], [T, k]
        return torch.softmax(top_logits, dim=-1, dtype=torch.float32), topk_ids
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [T, E]
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)  # [T, k], [T, k]
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


class TopKRouter(CustomOp):
    """``select_experts`` as a swappable op (``"moe_topk_router"``), with a layer's expert-load count folded in.

    Constants a kernel reads: ``top_k``, ``renormalize`` and ``softmax_after_topk``.
    ``forward(router_logits, counts=None, num_tokens=None)`` returns ``select_experts``'s ``(topk_weights,
    topk_ids)``; with ``counts`` ([num_experts] int64, a layer's row of ``ExpertLoad.counts``) it also adds every
    assignment of the first ``num_tokens`` rows (a 0-d int64 tensor on the same device; later rows are CUDA-graph
    padding) to ``counts``, in place, with no host sync. brigade-cuda registers one Triton kernel for all of it.
    """

    op_name = "moe_topk_router"

    def __init__(self, top_k: int, renormalize: bool, softmax_after_topk: bool = False):
        super().__init__()
        self.top_k = top_k
        self.renormalize = renormalize
        self.softmax_after_topk = softmax_after_topk

    def forward_native(self, router_logits: torch.Tensor, counts: torch.Tensor | None = None,
                       num_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        topk_weights, topk_ids = select_experts(router_logits, self.top_k, self.renormalize, self.softmax_after_topk)
        if counts is not None:
            count_routing(topk_ids, counts, num_tokens)
        return topk_weights, topk_ids


def count_routing(topk_ids: torch.Tensor, counts: torch.Tensor, num_tokens: torch.Tensor) -> None:
    """Add every expert assignment of the first ``num_tokens`` rows of ``topk_ids`` [T, k] to ``counts``
    ([num_experts] int64, in place), with no host sync (later rows are CUDA-graph padding)."""
    rows, top_k = topk_ids.shape
    real = (torch.arange(rows, device=topk_ids.device) < num_tokens).to(torch.int64)  # [T]
    ones = real[:, None].expand(rows, top_k).reshape(-1)  # [T * k], graph-safe
    counts.scatter_add_(0, topk_ids.reshape(-1), ones)
