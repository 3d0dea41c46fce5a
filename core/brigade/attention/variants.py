"""The attention variants in plain PyTorch: sliding-window masks, logit soft-capping and attention sinks.

The conventions are transformers' (the models' reference implementations):

- **sliding window** ``W`` (Mistral, Gemma 2, gpt-oss): the query at absolute position ``p`` attends to the
  key positions ``[p - W + 1, p]``, ``W`` keys with its own (``masking_utils.sliding_window_overlay``:
  ``kv_idx > q_idx - W``);
- **logit soft-capping** ``c`` (Gemma 2): each scaled score ``s`` becomes ``c * tanh(s / c)`` before the mask
  and the softmax (Gemma 2's ``eager_attention_forward`` caps after the scale);
- **attention sinks** (gpt-oss): a learned logit ``sinks[h]`` per query head joins each softmax's denominator
  and attends to no value: ``out = sum_j exp(s_j - m) v_j / (exp(sinks[h] - m) + sum_j exp(s_j - m))`` with
  ``m`` the maximum over the scores and the sink (gpt-oss's ``eager_attention_forward``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """Which keys each query sees: ``k <= q``, and ``k > q - sliding_window`` under a window.

    Args:
        q_pos: [..., Lq, 1] int absolute positions of the queries.
        k_pos: [..., 1, S] int absolute positions of the keys.
        sliding_window: the window in tokens (the query's own key counted), or None for full attention.

    Returns: the broadcast [..., Lq, S] bool, True where the query attends.
    """
    mask = k_pos <= q_pos
    if sliding_window is not None:
        mask = mask & (k_pos > q_pos - sliding_window)
    return mask


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, *,
           logits_soft_cap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Masked softmax attention with optional soft-capping and sinks; grouped-query heads need no K/V copy.

    Without soft cap or sinks this is one ``scaled_dot_product_attention`` call. With either, the scores are
    materialized in fp32: ``s = scale * q.k``, capped, masked, joined by the sink column, softmaxed, and the
    sink's probability dropped.

    Args:
        q: [B, H, Lq, D]; k, v: [B, Hkv, S, D] with ``H % Hkv == 0`` (query head h reads KV head
            ``h // (H // Hkv)``), all of one float dtype.
        mask: bool, broadcastable to [B, H, Lq, S], True where the query attends. A query row with no key
            attends to nothing: its output is zero with sinks, undefined without (callers drop such rows).
        scale: the softmax scale (multiplies q.k before the cap).
        logits_soft_cap: ``c`` of ``c * tanh(s / c)``, or None.
        sinks: [H] float32 sink logits, or None.

    Returns: [B, H, Lq, D] in q's dtype.
    """
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if logits_soft_cap is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=num_heads != num_kv_heads)
    batch, _, q_len, head_size = q.shape
    group = num_heads // num_kv_heads
    # Each KV head's G query heads become G * Lq rows of one product with that head's keys.
    qg = q.float().reshape(batch, num_kv_heads, group * q_len, head_size)
    scores = (qg @ k.float().transpose(-1, -2)).mul_(scale)  # [B, Hkv, G * Lq, S]
    scores = scores.view(batch, num_heads, q_len, -1)
    if logits_soft_cap is not None:
        scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink_col = sinks.float().to(scores.device).view(1, num_heads, 1, 1).expand(batch, -1, q_len, 1)
        probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # a row with no key: zeros, not NaN
    out = probs.reshape(batch, num_kv_heads, group * q_len, -1) @ v.float()  # [B, Hkv, G * Lq, D]
    return out.view(batch, num_heads, q_len, head_size).to(q.dtype)


__all__ = ["attend", "causal_mask"]
