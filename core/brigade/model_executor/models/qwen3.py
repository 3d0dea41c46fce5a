"""Qwen3 (dense): the Llama block with an RMSNorm over ``head_dim`` on each query and key head before the rotary
embedding (Yang et al. 2025, "Qwen3 Technical Report", arXiv:2505.09388; transformers' ``Qwen3Attention``).

Everything else is ``llama``'s: no biases unless ``attention_bias`` (then on q, k, v and o), ``head_dim`` from the
config. Under tensor parallelism each rank normalizes its own whole heads with the one shared ``head_dim`` weight,
so ``q_norm``/``k_norm`` are replicated and need no communication; pipeline stages hold their layers' norms.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from brigade.attention.backend import AttentionContext
from brigade.model_executor.layers.layernorm import RMSNorm
from brigade.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    """Llama attention with an RMSNorm over ``head_dim`` on each query and key head before the rotation
    (``q_norm``, ``k_norm``: one [head_dim] weight each, shared by all heads). Also Qwen3-MoE's attention."""

    def __init__(self, config: Any, **kwargs: Any):
        super().__init__(config, **kwargs)
        self.q_norm = RMSNorm(self.head_size, config.rms_norm_eps, dtype=kwargs["dtype"])
        self.k_norm = RMSNorm(self.head_size, config.rms_norm_eps, dtype=kwargs["dtype"])

    def forward(self, positions: torch.Tensor, h: torch.Tensor, rest: torch.Tensor | None, ctx: AttentionContext,
                norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As ``LlamaAttention.forward``, with q and k normalized per head after the projection."""
        qkv, stream = self.qkv_proj.forward_normed(h, rest, norm)
        q, k, v = self.qkv_proj.split(qkv)  # [T, H*D], [T, Hkv*D], [T, Hkv*D] (this rank's heads)
        q = self.q_norm(q.reshape(-1, self.head_size)).view(q.shape[0], -1)  # [T*H, D]: each head over D
        k = self.k_norm(k.reshape(-1, self.head_size)).view(k.shape[0], -1)
        attn = self.attn(q, k, v, ctx, positions=positions, rotary_emb=self.rotary_emb)
        return self.o_proj.forward_add(attn, stream)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls: ClassVar[type[nn.Module]] = Qwen3Attention


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 dense (``Qwen3ForCausalLM``): ``LlamaForCausalLM`` with ``Qwen3DecoderLayer``; tensor and pipeline
    parallel like it."""

    decoder_layer_cls: ClassVar[type[nn.Module]] = Qwen3DecoderLayer
