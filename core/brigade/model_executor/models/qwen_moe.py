"""Qwen2-MoE and Qwen3-MoE: the Qwen decoders with sparse MoE blocks (Qwen Team, "Qwen1.5-MoE", 2024; Yang et al.
2025, arXiv:2505.09388).

* Router: softmax over ``num_experts``, top ``num_experts_per_tok``, renormalised only when ``norm_topk_prob``
  (false in Qwen1.5/Qwen2-MoE, true in Qwen3-MoE checkpoints). Experts are ``moe_intermediate_size`` wide.
* Qwen2-MoE adds a shared expert (``shared_expert``, ``shared_expert_intermediate_size`` wide) that every token
  goes through, scaled by ``sigmoid(shared_expert_gate(x))``, and biases q/k/v (``qkv_bias``).
* Qwen3-MoE has no shared expert and no biases (unless ``attention_bias``), and RMS-normalises each head of q and
  k over ``head_dim`` before the rotary embedding (``qwen3.Qwen3Attention``, shared with dense Qwen3).
* A layer is sparse unless it is listed in ``mlp_only_layers`` or ``(layer + 1) % decoder_sparse_step != 0``;
  the others are dense SwiGLU MLPs of ``intermediate_size`` (transformers' ``Qwen2MoeDecoderLayer``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from brigade.model_executor.models.qwen3 import Qwen3Attention
from brigade.model_executor.models.sparse_moe import MoEDecoderLayer, MoEForCausalLM


class QwenMoeDecoderLayer(MoEDecoderLayer):
    """Sparse where Qwen's ``mlp_only_layers`` and ``decoder_sparse_step`` say so, dense elsewhere."""

    @staticmethod
    def is_sparse(config: Any, layer_idx: int) -> bool:
        step = getattr(config, "decoder_sparse_step", 1) or 1
        return (layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
                and config.num_experts > 0 and (layer_idx + 1) % step == 0)


class Qwen2MoeForCausalLM(MoEForCausalLM):
    """Qwen2-MoE (and Qwen1.5-MoE): shared expert with its sigmoid gate; q/k/v biases."""

    decoder_layer_cls: ClassVar[type[nn.Module]] = QwenMoeDecoderLayer


class Qwen3MoeDecoderLayer(QwenMoeDecoderLayer):
    attention_cls: ClassVar[type[nn.Module]] = Qwen3Attention


class Qwen3MoeForCausalLM(MoEForCausalLM):
    """Qwen3-MoE: q/k norms, no shared expert (the config's ``shared_expert_intermediate_size`` is absent)."""

    decoder_layer_cls: ClassVar[type[nn.Module]] = Qwen3MoeDecoderLayer
