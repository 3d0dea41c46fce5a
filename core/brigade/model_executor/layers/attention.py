"""The Attention layer: the model's handle on the paged-attention backend.

The layer knows its index in the model and nothing about batching. Per step it reshapes the flat
projections to heads and calls its backend with its own KV cache, ``ctx.kv_caches[layer_idx]``,
and the step's shared metadata, both passed explicitly through ``AttentionContext`` rather than a
module-level forward context. Given the model's rotary embedding and the positions, it leaves the Q/K
rotation to the backend (``forward_rotary``), which may fuse it into its KV-cache write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from brigade.attention.backend import AttentionBackend, AttentionContext
from brigade.interfaces.kv_cache_spec import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec


class Attention(nn.Module):
    """Causal multi-head attention over the paged KV cache, with grouped-query heads (Ainslie et al. 2023).

    Invariant: ``num_heads`` is a multiple of ``num_kv_heads``; query head ``h`` reads KV head
    ``h // (num_heads // num_kv_heads)``.
    """

    def __init__(self, num_heads: int, head_size: int, num_kv_heads: int, *, scale: float, layer_idx: int,
                 backend_cls: type[AttentionBackend], sliding_window: int | None = None,
                 logits_soft_cap: float | None = None, use_sinks: bool = False):
        """Args:
            num_heads, num_kv_heads: this rank's query and KV heads; head_size: their width.
            scale: the factor on ``q . k`` (usually ``head_size ** -0.5``).
            layer_idx: the model's layer index (picks ``ctx.kv_caches[layer_idx]``).
            backend_cls: the attention backend.
            sliding_window: a token at position ``p`` attends to ``[p - sliding_window + 1, p]`` only (None: the
                whole context). The layer's KV cache spec is then a ``SlidingWindowSpec``.
            logits_soft_cap: scores become ``cap * tanh(score / cap)`` before the softmax (Gemma 2); None: none.
            use_sinks: one learned logit per query head joins each softmax's denominator (gpt-oss's attention
                sinks); the layer owns it as the parameter ``sinks`` [num_heads] float32.

        Raises:
            ValueError: heads that do not group, or a feature the backend lacks (named, with the backend).
        """
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.layer_idx = layer_idx
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.sinks = nn.Parameter(torch.zeros(num_heads, dtype=torch.float32), requires_grad=False) \
            if use_sinks else None
        self.backend = backend_cls(num_heads, head_size, num_kv_heads, scale, sliding_window=sliding_window,
                                   logits_soft_cap=logits_soft_cap, sinks=self.sinks)
        self.kv_scales_loaded = False  # whether a k or v scale came from the checkpoint (``kv_scales``)
        self.unused_scales = 0  # q_scale / prob_scale tensors of the checkpoint, checked and not used

    def set_kv_scale(self, which: str, value: float) -> None:
        """Set the fp8 KV cache's ``which`` ("k" or "v") scale of this layer: a positive finite float, fixed
        from then on (CUDA graphs capture it as a kernel constant)."""
        setattr(self.backend, f"{which}_scale", float(value))
        self.kv_scales_loaded = True

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, ctx: AttentionContext, *,
                positions: torch.Tensor | None = None, rotary_emb: Callable[..., Any] | None = None
                ) -> torch.Tensor:
        """Write this step's K/V into the layer's cache and attend, rotating Q/K first when asked.

        Args:
            query: [num_tokens, num_heads * head_size]
            key, value: [num_tokens, num_kv_heads * head_size]
            ctx: the step's metadata and every layer's KV cache.
            positions: [num_tokens] int64 absolute positions; with ``rotary_emb``, the backend applies
                the rotation (``AttentionBackend.forward_rotary``, which may fuse it with the KV write).
            rotary_emb: the model's ``RotaryEmbedding``, or None when query/key are already rotated.

        Returns:
            [num_tokens, num_heads * head_size] in query's dtype.

        Raises:
            ValueError: only one of ``positions`` and ``rotary_emb`` is given.
        """
        if (positions is None) != (rotary_emb is None):
            raise ValueError("Attention.forward needs both positions and rotary_emb, or neither")
        num_tokens = query.shape[0]
        q = query.view(num_tokens, self.num_heads, self.head_size)
        k = key.view(num_tokens, self.num_kv_heads, self.head_size)
        v = value.view(num_tokens, self.num_kv_heads, self.head_size)
        kv_cache = ctx.kv_caches[self.layer_idx]
        metadata = ctx.metadata_for(self.layer_idx)
        if rotary_emb is None:
            out = self.backend.forward(q, k, v, kv_cache, metadata)
        else:
            out = self.backend.forward_rotary(positions, q, k, v, kv_cache, metadata, rotary_emb)
        return out.reshape(num_tokens, self.num_heads * self.head_size)

    def kv_cache_spec(self, block_size: int, cache_dtype: torch.dtype) -> KVCacheSpec:
        """This layer's KV storage: full attention, or a sliding window of ``sliding_window`` tokens."""
        dtype = str(cache_dtype).removeprefix("torch.")
        if self.sliding_window is None:
            return FullAttentionSpec(block_size, self.num_kv_heads, self.head_size, dtype)
        return SlidingWindowSpec(block_size, self.num_kv_heads, self.head_size, dtype, self.sliding_window)

    def extra_repr(self) -> str:
        scales = f", k_scale={self.backend.k_scale}, v_scale={self.backend.v_scale}" if self.kv_scales_loaded else ""
        window = f", sliding_window={self.sliding_window}" if self.sliding_window is not None else ""
        cap = f", logits_soft_cap={self.logits_soft_cap}" if self.logits_soft_cap is not None else ""
        sinks = ", sinks" if self.sinks is not None else ""
        return (f"layer={self.layer_idx}, heads={self.num_heads}, kv_heads={self.num_kv_heads}, "
                f"head_size={self.head_size}{window}{cap}{sinks}, backend={type(self.backend).__name__}{scales}")
