"""The fp8 KV cache in the Triton kernels: float8 e4m3 storage with one k scale and one v scale per layer.

The format is the core's (``brigade.attention.fp8_kv``, after vLLM's ``--kv-cache-dtype fp8``): a write stores
``x * (1 / scale)`` computed in fp32, saturated to ±448 and rounded to e4m3 (``quantize_fp8`` then the store's
cast), bit for bit as the reference backend stores it; a read upcasts the e4m3 values to the query's dtype (exact)
and leaves the scales to the products around it: the k scale is folded into the softmax scale on the host
(``kernel_scales``), the v scale multiplies the normalized output. Every kernel takes the scales as plain fp32
arguments behind a ``KV_FP8: tl.constexpr`` switch; a cache in the model dtype passes ``None`` for them, which
Triton turns into constexprs: that variant compiles the same code as before the switch existed, and the fp8 branches
are not in it. The scales are fixed at load, so CUDA graphs capture them as kernel constants.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brigade.attention.fp8_kv import FP8_E4M3_MAX, inverse_scale, is_fp8_kv

FP8_MAX = tl.constexpr(FP8_E4M3_MAX)


@triton.jit
def quantize_fp8(x, inv_scale):
    """``x * inv_scale`` in fp32, saturated to the e4m3 range (the caller's store casts it to the cache)."""
    return tl.minimum(tl.maximum(x.to(tl.float32) * inv_scale, -FP8_MAX), FP8_MAX)


def kernel_scales(kv_cache: torch.Tensor, k_scale: float, v_scale: float
                  ) -> tuple[bool, float, float | None, float | None, float | None]:
    """What a kernel launch takes for this cache: ``(KV_FP8, k_scale folded into the softmax scale, v_scale,
    1 / k_scale, 1 / v_scale)``; for a cache in the model dtype ``(False, 1.0, None, None, None)``."""
    if not is_fp8_kv(kv_cache):
        return False, 1.0, None, None, None
    return True, k_scale, v_scale, inverse_scale(k_scale), inverse_scale(v_scale)


__all__ = ["FP8_MAX", "kernel_scales", "quantize_fp8"]
