"""DeepSeekMoE's router: grouped (device-limited) top-k over softmax or sigmoid scores, with V3's bias.

DeepSeek-V2 (arXiv:2405.04434, section 2.2.2): softmax scores; with ``topk_method`` ``"group_limited_greedy"``
the experts fall in ``n_group`` groups, a group scores its best expert, and only the ``topk_group`` best groups
compete for the ``top_k`` slots (``"greedy"``: all experts compete). DeepSeek-V3 (arXiv:2412.19437, section
2.1.2, ``topk_method`` ``"noaux_tc"``): sigmoid scores; a per-expert ``e_score_correction_bias`` (the
auxiliary-loss-free balancing bias) is added for the choice only, a group scores the sum of its two best biased
scores, and the weights are the unbiased scores of the chosen experts, renormalized when ``norm_topk_prob``.
Either way the weights are then multiplied by ``routed_scaling_factor``. This is what transformers'
``DeepseekV2TopkRouter`` / ``DeepseekV3TopkRouter`` compute (V2 also renormalizes when ``norm_topk_prob``, as
DeepSeek's own code and vLLM do).
"""

from __future__ import annotations

import torch
from torch import nn

from brigade.model_executor.layers.custom_op import CustomOp
from brigade.model_executor.layers.moe_router import count_routing

SCORING_FUNCS = ("softmax", "sigmoid")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def grouped_topk(router_logits: torch.Tensor, top_k: int, *, scoring_func: str, num_groups: int, topk_group: int,
                 renormalize: bool, routed_scaling_factor: float, correction_bias: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ``top_k`` experts, chosen within its ``topk_group`` best of ``num_groups`` expert groups.

    Args:
        router_logits: [T, E], any float dtype (computed in fp32 here).
        top_k: experts per token; scoring_func: "softmax" or "sigmoid".
        num_groups, topk_group: E experts in ``num_groups`` equal groups, ``topk_group`` of them eligible per
            token (1 and 1: no grouping).
        renormalize: divide the chosen weights by their sum (plus 1e-20).
        routed_scaling_factor: multiplies the final weights.
        correction_bias: [E] fp32, added to the scores for the choice only (V3's noaux_tc); a group then scores
            the sum of its two best biased scores, else its best score.

    Returns:
        (topk_weights [T, top_k] float32, topk_ids [T, top_k] int64).
    """
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring_func == "softmax" else logits.sigmoid()  # [T, E]
    choice = scores if correction_bias is None else scores + correction_bias
    if num_groups > 1:
        num_tokens, num_experts = choice.shape
        grouped = choice.view(num_tokens, num_groups, num_experts // num_groups)
        if correction_bias is None:
            group_scores = grouped.max(dim=-1).values  # [T, G]
        else:
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        group_ids = torch.topk(group_scores, topk_group, dim=-1).indices  # [T, topk_group]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_ids, True)
        expert_mask = group_mask[:, :, None].expand_as(grouped).reshape(num_tokens, num_experts)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    topk_ids = torch.topk(choice, top_k, dim=-1).indices  # [T, k]
    topk_weights = scores.gather(1, topk_ids)
    if renormalize:
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
    return topk_weights * routed_scaling_factor, topk_ids


class GroupedTopKRouter(CustomOp):
    """``grouped_topk`` as an op, with the expert-load count folded in (as ``TopKRouter``). With V3's balancing
    bias it owns ``e_score_correction_bias`` ([E] fp32, loaded from the checkpoint's
    ``mlp.gate.e_score_correction_bias``). No platform registers a kernel for it yet (no ``op_name``): it runs
    ``forward_native`` everywhere."""

    def __init__(self, num_experts: int, top_k: int, *, scoring_func: str, num_groups: int, topk_group: int,
                 renormalize: bool, routed_scaling_factor: float, use_correction_bias: bool):
        super().__init__()
        self.top_k = top_k
        self.scoring_func = scoring_func
        self.num_groups = num_groups
        self.topk_group = topk_group
        self.renormalize = renormalize
        self.routed_scaling_factor = routed_scaling_factor
        self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts, dtype=torch.float32),
                                                    requires_grad=False) if use_correction_bias else None

    def forward_native(self, router_logits: torch.Tensor, counts: torch.Tensor | None = None,
                       num_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        topk_weights, topk_ids = grouped_topk(
            router_logits, self.top_k, scoring_func=self.scoring_func, num_groups=self.num_groups,
            topk_group=self.topk_group, renormalize=self.renormalize,
            routed_scaling_factor=self.routed_scaling_factor, correction_bias=self.e_score_correction_bias)
        if counts is not None:
            count_routing(topk_ids, counts, num_tokens)
        return topk_weights, topk_ids

    def extra_repr(self) -> str:
        return (f"top_k={self.top_k}, scoring={self.scoring_func}, groups={self.topk_group}/{self.num_groups}, "
                f"renormalize={self.renormalize}, scale={self.routed_scaling_factor}, "
                f"bias={self.e_score_correction_bias is not None}")
