"""The Attention layer: the model's handle on the paged-attention backend (book ch. 5, 6).

The layer knows its index in the model and nothing about batching. Per step it reshapes the flat
projections to heads and calls its backend with its own KV cache, ``ctx.kv_caches[layer_idx]``,
and the step's shared metadata, both passed explicitly through ``AttentionContext`` rather than a
module-level forward context.
"""

from __future__ import annotations

import torch
from torch import nn

from brigade.attention.backend import AttentionBackend, AttentionContext


class Attention(nn.Module):
    """Causal multi-head attention over the paged KV cache, with grouped-query heads (Ainslie et al. 2023).

    Invariant: ``num_heads`` is a multiple of ``num_kv_heads``; query head ``h`` reads KV head
    ``h // (num_heads // num_kv_heads)``.
    """

    def __init__(self, num_heads: int, head_size: int, num_kv_heads: int, *, scale: float, layer_idx: int,
                 backend_cls: type[AttentionBackend]):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.layer_idx = layer_idx
        self.backend = backend_cls(num_heads, head_size, num_kv_heads, scale)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                ctx: AttentionContext) -> torch.Tensor:
        """Write this step's K/V into the layer's cache and attend.

        Args:
            query: [num_tokens, num_heads * head_size]
            key, value: [num_tokens, num_kv_heads * head_size]
            ctx: the step's metadata and every layer's KV cache.

        Returns:
            [num_tokens, num_heads * head_size] in query's dtype.
        """
        num_tokens = query.shape[0]
        q = query.view(num_tokens, self.num_heads, self.head_size)
        k = key.view(num_tokens, self.num_kv_heads, self.head_size)
        v = value.view(num_tokens, self.num_kv_heads, self.head_size)
        out = self.backend.forward(q, k, v, ctx.kv_caches[self.layer_idx], ctx.metadata)
        return out.reshape(num_tokens, self.num_heads * self.head_size)

    def extra_repr(self) -> str:
        return (f"layer={self.layer_idx}, heads={self.num_heads}, kv_heads={self.num_kv_heads}, "
                f"head_size={self.head_size}, backend={type(self.backend).__name__}")
