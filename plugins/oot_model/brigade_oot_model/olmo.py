"""OLMo (Groeneveld et al. 2024) as an out-of-tree Brigade model.

It implements the model interface (``brigade.model_executor.models.interface.CausalLM``) with plain
``torch.nn`` layers and two core layers: ``Attention`` (paged attention over Brigade's KV cache) and
``RotaryEmbedding``. OLMo is Llama with LayerNorms that have no weight or bias, and an optional clip of
the q/k/v activations (``clip_qkv``). It declares no capability, so it runs on one device.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from brigade.attention.backend import AttentionBackend, AttentionContext
from brigade.model_executor.layers.attention import Attention
from brigade.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope_parameters
from brigade.model_executor.models.interface import CausalLM


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    """OLMo's LayerNorm without parameters, computed in fp32 as transformers does. x: [T, hidden]."""
    return F.layer_norm(x.float(), x.shape[-1:], eps=1e-5).to(x.dtype)


class OlmoAttention(nn.Module):
    def __init__(self, config: Any, layer_idx: int, rotary_emb: RotaryEmbedding, dtype: torch.dtype,
                 attn_backend: type[AttentionBackend]):
        super().__init__()
        hidden, self.num_heads = config.hidden_size, config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads or self.num_heads
        self.head_size = getattr(config, "head_dim", None) or hidden // self.num_heads
        bias = bool(config.attention_bias)
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_size, bias=bias, dtype=dtype)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_size, bias=bias, dtype=dtype)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_size, bias=bias, dtype=dtype)
        self.o_proj = nn.Linear(self.num_heads * self.head_size, hidden, bias=bias, dtype=dtype)
        self.clip_qkv = config.clip_qkv
        self.rotary_emb = rotary_emb
        self.attn = Attention(self.num_heads, self.head_size, self.num_kv_heads, scale=self.head_size ** -0.5,
                              layer_idx=layer_idx, backend_cls=attn_backend)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # [T, heads * head_size]
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        return self.o_proj(self.attn(q, k, v, ctx, positions=positions, rotary_emb=self.rotary_emb))


class OlmoLayer(nn.Module):
    def __init__(self, config: Any, layer_idx: int, rotary_emb: RotaryEmbedding, dtype: torch.dtype,
                 attn_backend: type[AttentionBackend]):
        super().__init__()
        self.self_attn = OlmoAttention(config, layer_idx, rotary_emb, dtype, attn_backend)
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inter, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(hidden, inter, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(inter, hidden, bias=False, dtype=dtype)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        h = h + self.self_attn(positions, layer_norm(h), ctx)
        x = layer_norm(h)
        return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class OlmoForCausalLM(CausalLM):
    """OLMo's causal LM. Parameter names are transformers' (``model.layers.{i}.self_attn.q_proj.weight``,
    ``model.layers.{i}.mlp.gate_proj.weight`` is stored as ``model.layers.{i}.gate_proj.weight``)."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type[AttentionBackend],
                 quant_config: Any = None, expert_parallel: bool = False, max_model_len: int | None = None):
        super().__init__(hf_config, dtype=dtype, attn_backend=attn_backend)
        if quant_config is not None:
            raise ValueError("the example OLMo model has no quantized layers; serve it without --quantization")
        config = hf_config
        head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rotary_emb = RotaryEmbedding(head_size, head_size, config.max_position_embeddings,
                                     get_rope_parameters(config), is_neox_style=True)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(OlmoLayer(config, i, rotary_emb, dtype, attn_backend)
                                    for i in range(config.num_hidden_layers))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype)
        self.tie_word_embeddings = bool(config.tie_word_embeddings)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext,
                intermediate: Any = None) -> torch.Tensor:
        """input_ids, positions: [T] int64. Returns [T, hidden] before the final norm."""
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(positions, h, ctx)
        return h

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab]: the final (parameter-free) norm, then the LM head."""
        return self.lm_head(layer_norm(hidden_states))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy each checkpoint tensor into the parameter of the same name (``model.`` prefix and ``mlp.``
        dropped). Raises ValueError for an unknown name, a wrong shape, or a parameter left unfilled."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            if self.tie_word_embeddings and hf_name == "lm_head.weight":
                continue
            name = hf_name.removeprefix("model.").replace(".mlp.", ".")
            param = params.get(name)
            if param is None or param.shape != tensor.shape:
                raise ValueError(f"checkpoint tensor {hf_name!r} {tuple(tensor.shape)} fits no parameter of OLMo")
            with torch.no_grad():
                param.copy_(tensor)
            loaded.add(name)
        missing = set(params) - loaded - ({"lm_head.weight"} if self.tie_word_embeddings else set())
        if missing:
            raise ValueError(f"the checkpoint lacks {', '.join(sorted(missing))}")
        return loaded
