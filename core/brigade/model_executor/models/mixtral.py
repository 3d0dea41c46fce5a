"""Mixtral (Jiang et al. 2024, arXiv:2401.04088): the Mistral decoder with a sparse MoE block in every layer.

Each layer's router (``block_sparse_moe.gate``) picks ``num_experts_per_tok`` of ``num_local_experts`` SwiGLU
experts (``experts.{e}.w1`` gate, ``w3`` up, ``w2`` down, each ``intermediate_size`` wide) by a softmax over all
experts, and the chosen probabilities are always renormalised to sum to one (transformers' ``MixtralTopKRouter``
divides them by their sum unconditionally; Mixtral configs have no ``norm_topk_prob``). Attention is Mistral's:
GQA, no biases; a ``sliding_window`` caps max_model_len to the window, as for Mistral.
"""

from __future__ import annotations

from typing import Any

from brigade.model_executor.models.sparse_moe import MoEForCausalLM


class MixtralForCausalLM(MoEForCausalLM):
    """Mixtral's checkpoint names ``...block_sparse_moe...`` for the MoE block, which Brigade calls ``mlp`` like
    every other decoder's feed-forward half; the rest is ``MoEForCausalLM``."""

    def checkpoint_name(self, hf_name: str) -> tuple[str, Any]:
        return super().checkpoint_name(hf_name.replace(".block_sparse_moe.", ".mlp."))
