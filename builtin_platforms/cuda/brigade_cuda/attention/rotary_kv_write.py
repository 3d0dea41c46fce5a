"""Rotary embedding fused with the KV-cache write: one kernel where a layer used to launch two.

A batch-1 decode step of an 8B model is ~350 tiny kernels per token, and every kernel boundary costs a
launch and the predecessor's drain (``brigade_cuda/pdl.py`` hides part of it, fusion removes it). Each
attention layer used to run the rotary kernel (``ops/rotary.py``) and then the backend's KV write
(``kv_write.py``), which reads back the key the rotary kernel had just written. Here one program per
token rotates its query heads in place, rotates its key heads in registers, stores the rotated key both
back in place and into ``kv_cache[0]`` at ``slot_mapping[token]``, and copies the value row into
``kv_cache[1]``. The rotation is the one of ``ops/rotary.py`` (its jit helpers are reused), so Q, K and
the cache are bit-identical to running the two kernels in sequence; slot -1 (padding) skips the cache
write only, as ``write_kv_cache`` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brigade_cuda.attention.fp8_kv import kernel_scales, quantize_fp8
from brigade_cuda.attention.kv_write import has_contiguous_blocks
from brigade_cuda.ops.rotary import _head_view_strides, _load_cos_sin, _pair_offsets, _rotate_heads, _rotate_pair
from brigade_cuda.pdl import gdc_prologue, pdl_launch


@triton.jit
def _rotary_kv_write_kernel(
    positions_ptr, q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, cos_sin_ptr,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_cache_slot, stride_cache_h, stride_cos_sin, k_inv_scale, v_inv_scale,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, Q_HEADS_P2: tl.constexpr,
    KV_HEADS_P2: tl.constexpr, HEAD_SIZE: tl.constexpr, HEAD_P2: tl.constexpr,
    HALF: tl.constexpr, HALF_P2: tl.constexpr, IS_NEOX: tl.constexpr,
    USE_PDL: tl.constexpr = False, PDL_EARLY: tl.constexpr = False, KV_FP8: tl.constexpr = False,
):
    if USE_PDL:  # see brigade_cuda/pdl.py: wait for the previous kernel, let the next one launch
        gdc_prologue(PDL_EARLY)
    token = tl.program_id(0).to(tl.int64)
    cos, sin = _load_cos_sin(positions_ptr, cos_sin_ptr, token, stride_cos_sin, HALF, HALF_P2)
    _rotate_heads(q_ptr, token, stride_q_t, stride_q_h, cos, sin, NUM_Q_HEADS, Q_HEADS_P2, HALF, HALF_P2,
                  IS_NEOX)

    heads = tl.arange(0, KV_HEADS_P2)[:, None]
    # The token's slot as a [KV_HEADS_P2, 1] column of one value, so every mask is a tensor (see kv_write.py).
    slot = tl.load(slot_ptr + token + heads * 0).to(tl.int64)
    cached = (heads < NUM_KV_HEADS) & (slot >= 0)  # slot -1: padding, the cache is left alone
    k_row = k_ptr + token * stride_k_t + heads * stride_k_h
    k_dst = k_cache_ptr + slot * stride_cache_slot + heads * stride_cache_h
    v_dst = v_cache_ptr + slot * stride_cache_slot + heads * stride_cache_h

    # Rotated key channels: to the key in place (as the rotary kernel) and, from registers, to the cache.
    pairs = tl.arange(0, HALF_P2)[None, :]
    rotated = (heads < NUM_KV_HEADS) & (pairs < HALF)
    first, second = _pair_offsets(pairs, HALF, IS_NEOX)
    x1 = tl.load(k_row + first, mask=rotated, other=0.0).to(tl.float32)
    x2 = tl.load(k_row + second, mask=rotated, other=0.0).to(tl.float32)
    out1, out2 = _rotate_pair(x1, x2, cos, sin)
    out1 = out1.to(k_ptr.dtype.element_ty)  # rounded to the key's dtype first, as the two-kernel path does
    out2 = out2.to(k_ptr.dtype.element_ty)
    tl.store(k_row + first, out1, mask=rotated)
    tl.store(k_row + second, out2, mask=rotated)
    if KV_FP8:  # float8 e4m3 cache: the rotated key (rounded as above) / k_scale, saturated (fp8_kv.py)
        out1 = quantize_fp8(out1, k_inv_scale)
        out2 = quantize_fp8(out2, k_inv_scale)
    tl.store(k_dst + first, out1.to(k_cache_ptr.dtype.element_ty), mask=rotated & cached)
    tl.store(k_dst + second, out2.to(k_cache_ptr.dtype.element_ty), mask=rotated & cached)

    # Key channels past rotary_dim (never written above) and the value row are copied as they are.
    dims = tl.arange(0, HEAD_P2)[None, :]
    if 2 * HALF < HEAD_SIZE:
        rest = cached & (dims >= 2 * HALF) & (dims < HEAD_SIZE)
        k_rest = tl.load(k_row + dims, mask=rest)
        if KV_FP8:
            k_rest = quantize_fp8(k_rest, k_inv_scale)
        tl.store(k_dst + dims, k_rest.to(k_cache_ptr.dtype.element_ty), mask=rest)
    whole = cached & (dims < HEAD_SIZE)
    v = tl.load(v_ptr + token * stride_v_t + heads * stride_v_h + dims, mask=whole)
    if KV_FP8:
        v = quantize_fp8(v, v_inv_scale)
    tl.store(v_dst + dims, v.to(v_cache_ptr.dtype.element_ty), mask=whole)


def rotary_write_kv_cache(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          kv_cache: torch.Tensor, slot_mapping: torch.Tensor, cos_sin_cache: torch.Tensor, *,
                          is_neox_style: bool = True, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Rotate ``query`` and ``key`` in place and write the rotated key and ``value`` into the paged cache.

    Same effect as ``ops.rotary.rotary_embedding(positions, query, key, head_size, cos_sin_cache)`` then
    ``write_kv_cache(key, value, kv_cache, slot_mapping)`` on the first ``num_tokens =
    slot_mapping.shape[0]`` rows, bit for bit, in one launch (rows past ``num_tokens`` are not touched).

    Args:
        positions: [>= num_tokens] int32/int64 absolute positions, each < cos_sin_cache.shape[0].
        query: [>= num_tokens, num_heads, head_size] or [>= num_tokens, num_heads * head_size], rotated in
            place; only the last dimension must be contiguous (views of a fused QKV output are fine).
        key, value: likewise with num_kv_heads; key is rotated in place, value only read.
        kv_cache: [2, num_blocks, block_size, num_kv_heads, head_size], each block contiguous; written in
            place (K and V rows of each non-padding token, cast to its dtype; a float8 e4m3 cache stores them
            divided by ``k_scale``/``v_scale`` and saturated, as ``write_kv_cache``).
        slot_mapping: [num_tokens] int32/int64 flat slots (``block_id * block_size + offset``); -1 = padding,
            whose q/k are still rotated but whose cache write is skipped.
        cos_sin_cache: [max_position, rotary_dim] fp32, cos then sin of each frequency; row-major,
            rotary_dim even and <= head_size (channels past rotary_dim are not rotated).
        is_neox_style: pair channel i with i + rotary_dim/2 (True) or 2i with 2i+1 (False).

    Raises:
        ValueError: on a layout the kernel cannot address (non-contiguous last dimension or cache block,
            mismatched head counts or head sizes, bad ``cos_sin_cache``).
    """
    num_tokens = slot_mapping.shape[0]
    _, _, _, num_kv_heads, head_size = kv_cache.shape
    num_q_heads, stride_q_t, stride_q_h = _head_view_strides(query, head_size, "query")
    num_k_heads, stride_k_t, stride_k_h = _head_view_strides(key, head_size, "key")
    num_v_heads, stride_v_t, stride_v_h = _head_view_strides(value, head_size, "value")
    if num_k_heads != num_kv_heads or num_v_heads != num_kv_heads:
        raise ValueError(f"key/value have {num_k_heads}/{num_v_heads} heads, the KV cache {num_kv_heads}")
    if not has_contiguous_blocks(kv_cache):
        raise ValueError("rotary_write_kv_cache needs each KV-cache block laid out contiguously")
    rotary_dim = cos_sin_cache.shape[-1]
    if cos_sin_cache.dim() != 2 or rotary_dim > head_size or rotary_dim % 2 or cos_sin_cache.stride(1) != 1:
        raise ValueError(f"cos_sin_cache must be [max_position, even rotary_dim <= {head_size}], row-major")
    if num_tokens == 0:
        return
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    half = rotary_dim // 2
    fp8, _, _, k_inv, v_inv = kernel_scales(kv_cache, k_scale, v_scale)
    _rotary_kv_write_kernel[(num_tokens,)](
        positions, query, key, value, k_cache, v_cache, slot_mapping, cos_sin_cache,
        stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h,
        k_cache.stride(1), k_cache.stride(2), cos_sin_cache.stride(0), k_inv, v_inv,
        NUM_Q_HEADS=num_q_heads, NUM_KV_HEADS=num_kv_heads, Q_HEADS_P2=triton.next_power_of_2(num_q_heads),
        KV_HEADS_P2=triton.next_power_of_2(num_kv_heads), HEAD_SIZE=head_size,
        HEAD_P2=triton.next_power_of_2(head_size), HALF=half, HALF_P2=triton.next_power_of_2(half),
        IS_NEOX=is_neox_style, num_warps=4, KV_FP8=fp8, **pdl_launch(),
    )
