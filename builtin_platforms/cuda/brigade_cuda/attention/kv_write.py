"""The KV-cache write kernel: scatter this step's K/V rows into the paged cache by slot.

This is the Triton counterpart of vLLM's ``reshape_and_cache_flash``: one program per new token reads
its flat slot from ``slot_mapping`` and copies the token's ``[num_kv_heads, head_size]`` K and V rows
into ``kv_cache[0|1, slot // block_size, slot % block_size]``. Slot -1 marks a padding row (CUDA-graph
padding), which is skipped by masking, so the launch shape depends only on ``slot_mapping.shape``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brigade_cuda.attention.fp8_kv import kernel_scales, quantize_fp8
from brigade_cuda.pdl import gdc_prologue, pdl_launch


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_key_t, stride_key_h, stride_value_t, stride_value_h,
    stride_cache_slot, stride_cache_h, k_inv_scale, v_inv_scale,
    NUM_KV_HEADS: tl.constexpr, HEAD_SIZE: tl.constexpr,
    HEADS_P2: tl.constexpr, HEAD_P2: tl.constexpr,
    USE_PDL: tl.constexpr = False, PDL_EARLY: tl.constexpr = False, KV_FP8: tl.constexpr = False,
):
    if USE_PDL:  # see brigade_cuda/pdl.py: wait for the previous kernel, let the next one launch
        gdc_prologue(PDL_EARLY)
    token = tl.program_id(0)
    heads = tl.arange(0, HEADS_P2)[:, None]
    dims = tl.arange(0, HEAD_P2)[None, :]
    # The token's slot, loaded as a [HEADS_P2, 1] column of one value so that every mask below is a
    # tensor (one cached load; also sidesteps the interpreter's scalar-mask limitation).
    slot = tl.load(slot_ptr + token + heads * 0).to(tl.int64)
    # A negative slot is a padding token: every lane is masked off, nothing is read or written.
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_SIZE) & (slot >= 0)
    tok = token.to(tl.int64)
    k = tl.load(key_ptr + tok * stride_key_t + heads * stride_key_h + dims, mask=mask)
    v = tl.load(value_ptr + tok * stride_value_t + heads * stride_value_h + dims, mask=mask)
    if KV_FP8:  # float8 e4m3 cache: x / scale, saturated (fp8_kv.py); k/v_inv_scale are None otherwise
        k = quantize_fp8(k, k_inv_scale)
        v = quantize_fp8(v, v_inv_scale)
    dst = slot * stride_cache_slot + heads * stride_cache_h + dims
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def has_contiguous_blocks(kv_cache: torch.Tensor) -> bool:
    """True when ``kv_cache`` [2, num_blocks, block_size, num_kv_heads, head_size] can be addressed by flat
    slot: each K and V half's ``[num_blocks * block_size, num_kv_heads, head_size]`` slots are row-major."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        return False
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    k_cache = kv_cache[0]
    return (k_cache.stride(3) == 1 and k_cache.stride(2) == head_size
            and k_cache.stride(1) == num_kv_heads * head_size and k_cache.stride(0) == block_size * k_cache.stride(1))


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Scatter new K/V rows into the paged cache, skipping slots equal to -1.

    Args:
        key, value: [num_tokens, num_kv_heads, head_size]; the last dim must be contiguous (row views of
            a fused QKV projection are fine).
        kv_cache: [2, num_blocks, block_size, num_kv_heads, head_size], written in place; its
            ``[block_size, num_kv_heads, head_size]`` part must be contiguous. A float8 e4m3 cache stores
            ``key / k_scale`` and ``value / v_scale`` saturated to ±448 (``fp8_kv.py``); other dtypes ignore them.
        slot_mapping: [num_tokens] int32/int64 flat slots (``block_id * block_size + offset``).

    Raises:
        ValueError: on a layout the kernel cannot address.
    """
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    num_kv_heads, head_size = kv_cache.shape[3], kv_cache.shape[4]
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("write_kv_cache needs key/value with a contiguous last dimension")
    if not has_contiguous_blocks(kv_cache):
        raise ValueError("write_kv_cache needs each KV-cache block laid out contiguously")
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    fp8, _, _, k_inv, v_inv = kernel_scales(kv_cache, k_scale, v_scale)
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(1), k_cache.stride(2), k_inv, v_inv,
        NUM_KV_HEADS=num_kv_heads, HEAD_SIZE=head_size,
        HEADS_P2=triton.next_power_of_2(num_kv_heads), HEAD_P2=triton.next_power_of_2(head_size),
        num_warps=4, KV_FP8=fp8, **pdl_launch(),
    )
