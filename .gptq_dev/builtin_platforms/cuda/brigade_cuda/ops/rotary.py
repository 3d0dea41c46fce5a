"""Rotary position embedding applied in place to queries and keys, in Triton (Su et al. 2021, RoFormer).

One program per token reads the token's position, its ``cos | sin`` row of the cache, and rotates the
first ``rotary_dim`` channels of every query and key head in place (channels past ``rotary_dim`` are not
touched). Neox style pairs channel ``i`` with ``i + rotary_dim / 2`` (Llama, Mistral, Qwen2); GPT-J
style pairs ``2i`` with ``2i + 1``. Arithmetic is fp32, rounded once to the tensor's dtype, like the
native op in ``brigade.model_executor.layers.rotary_embedding``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brigade_cuda.pdl import gdc_prologue, pdl_launch


@triton.jit
def _pair_offsets(pairs, HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    """Channel offsets within a head of the two members of each rotated pair."""
    if IS_NEOX:
        first = pairs
        second = pairs + HALF
    else:
        first = 2 * pairs
        second = 2 * pairs + 1
    return first, second


@triton.jit
def _rotate_pair(x1, x2, cos, sin):
    """The rotation of fp32 pairs; the one place its arithmetic is written (bit-identical callers)."""
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _load_cos_sin(positions_ptr, cos_sin_ptr, token, stride_cache, HALF: tl.constexpr, HALF_P2: tl.constexpr):
    """The ``[1, HALF_P2]`` fp32 cos and sin rows at ``positions[token]`` (cos 1, sin 0 past HALF)."""
    pairs = tl.arange(0, HALF_P2)[None, :]
    # A [1, HALF_P2] row of one position, so every mask below is a tensor (see kv_write.py).
    pos = tl.load(positions_ptr + token + pairs * 0).to(tl.int64)
    pair_mask = pairs < HALF
    cos = tl.load(cos_sin_ptr + pos * stride_cache + pairs, mask=pair_mask, other=1.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cache + HALF + pairs, mask=pair_mask, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotate_heads(x_ptr, token, stride_t, stride_h, cos, sin,
                  NUM_HEADS: tl.constexpr, HEADS_P2: tl.constexpr, HALF: tl.constexpr,
                  HALF_P2: tl.constexpr, IS_NEOX: tl.constexpr):
    heads = tl.arange(0, HEADS_P2)[:, None]
    pairs = tl.arange(0, HALF_P2)[None, :]
    mask = (heads < NUM_HEADS) & (pairs < HALF)
    base = x_ptr + token * stride_t + heads * stride_h
    first, second = _pair_offsets(pairs, HALF, IS_NEOX)
    x1 = tl.load(base + first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + second, mask=mask, other=0.0).to(tl.float32)
    out1, out2 = _rotate_pair(x1, x2, cos, sin)
    tl.store(base + first, out1.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(base + second, out2.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_cache,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, Q_HEADS_P2: tl.constexpr,
    K_HEADS_P2: tl.constexpr, HALF: tl.constexpr, HALF_P2: tl.constexpr, IS_NEOX: tl.constexpr,
    USE_PDL: tl.constexpr = False, PDL_EARLY: tl.constexpr = False,
):
    if USE_PDL:  # see brigade_cuda/pdl.py: wait for the previous kernel, let the next one launch
        gdc_prologue(PDL_EARLY)
    token = tl.program_id(0).to(tl.int64)
    cos, sin = _load_cos_sin(positions_ptr, cos_sin_ptr, token, stride_cache, HALF, HALF_P2)
    _rotate_heads(q_ptr, token, stride_q_t, stride_q_h, cos, sin, NUM_Q_HEADS, Q_HEADS_P2, HALF, HALF_P2,
                  IS_NEOX)
    _rotate_heads(k_ptr, token, stride_k_t, stride_k_h, cos, sin, NUM_K_HEADS, K_HEADS_P2, HALF, HALF_P2,
                  IS_NEOX)


def _head_view_strides(x: torch.Tensor, head_size: int, name: str) -> tuple[int, int, int]:
    """(num_heads, token stride, head stride) of a [T, H*D] or [T, H, D] tensor with unit channel stride."""
    if x.stride(-1) != 1:
        raise ValueError(f"rotary_embedding needs {name} with a contiguous last dimension")
    if x.dim() == 2:
        if x.shape[1] % head_size:
            raise ValueError(f"{name} width {x.shape[1]} is not a multiple of head_size {head_size}")
        return x.shape[1] // head_size, x.stride(0), head_size
    if x.dim() == 3 and x.shape[2] == head_size:
        return x.shape[1], x.stride(0), x.stride(1)
    raise ValueError(f"{name} must be [num_tokens, heads * {head_size}] or [num_tokens, heads, {head_size}]")


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int,
                     cos_sin_cache: torch.Tensor, *, is_neox_style: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` and ``key`` in place at each token's position.

    Args:
        positions: [num_tokens] int32/int64 absolute positions, each < cos_sin_cache.shape[0].
        query: [num_tokens, num_heads * head_size] or [num_tokens, num_heads, head_size]; views of a
            fused QKV output are fine (only the last dimension must be contiguous).
        key: likewise with num_kv_heads.
        head_size: channels per head.
        cos_sin_cache: [max_position, rotary_dim] fp32, cos of each frequency in the first half of a
            row and sin in the second; rotary_dim <= head_size.
        is_neox_style: pair channel i with i + rotary_dim/2 (True) or 2i with 2i+1 (False).

    Returns:
        ``(query, key)``, the same tensors, rotated.
    """
    num_tokens = positions.shape[0]
    num_q_heads, stride_q_t, stride_q_h = _head_view_strides(query, head_size, "query")
    num_k_heads, stride_k_t, stride_k_h = _head_view_strides(key, head_size, "key")
    rotary_dim = cos_sin_cache.shape[1]
    if rotary_dim > head_size or rotary_dim % 2 or cos_sin_cache.stride(1) != 1:
        raise ValueError(f"cos_sin_cache must be [max_position, even rotary_dim <= {head_size}], row-major")
    if num_tokens == 0:
        return query, key
    half = rotary_dim // 2
    _rotary_kernel[(num_tokens,)](
        positions, query, key, cos_sin_cache,
        stride_q_t, stride_q_h, stride_k_t, stride_k_h, cos_sin_cache.stride(0),
        NUM_Q_HEADS=num_q_heads, NUM_K_HEADS=num_k_heads,
        Q_HEADS_P2=triton.next_power_of_2(num_q_heads), K_HEADS_P2=triton.next_power_of_2(num_k_heads),
        HALF=half, HALF_P2=triton.next_power_of_2(half), IS_NEOX=is_neox_style, num_warps=4, **pdl_launch(),
    )
    return query, key
