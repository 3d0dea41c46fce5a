"""The fp8 KV cache: float8 e4m3 storage with one k scale and one v scale per attention layer.

After vLLM's fp8 KV cache (``--kv-cache-dtype fp8``): the cache tensor is ``torch.float8_e4m3fn``, a write stores
``x / scale`` rounded to e4m3 (to nearest even) and saturated to the format's range ±448, a read returns
``stored * scale``. The scales are per tensor (one float for all K of a layer, one for all V), read from the
checkpoint where it has them (``brigade.model_executor.kv_scales``), else 1.0. The division is taken as a
product with the fp32 reciprocal ``1 / scale`` so that every backend (PyTorch here, the Triton kernels of
brigade-cuda) rounds exactly alike; it differs from a true division by at most one fp32 ulp before the fp8
rounding. Attention kernels may fold the k scale into the softmax scale and the v scale into the output (both
products are linear), which is what the Triton backend does.
"""

from __future__ import annotations

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_E4M3_MAX = 448.0
"""The largest finite float8 e4m3fn value; a write saturates to ±this."""


def is_fp8_kv(kv_cache: torch.Tensor) -> bool:
    """True when ``kv_cache`` is stored in float8 e4m3 (and reads must be scaled back)."""
    return kv_cache.dtype == FP8_KV_DTYPE


def inverse_scale(scale: float) -> float:
    """The multiplier a write uses, ``1 / scale`` (a Python float; kernels take it as fp32)."""
    return 1.0 / scale


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Rows to store: ``x * (1 / scale)`` in fp32, saturated to ±448, rounded to float8 e4m3.

    Args:
        x: any shape, any float dtype (the model's K or V rows).
        scale: the layer's k or v scale, a positive finite float.

    Returns: ``x``'s shape in ``torch.float8_e4m3fn`` (NaN stays NaN).
    """
    return (x.float() * inverse_scale(scale)).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_KV_DTYPE)


def dequantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Stored float8 e4m3 rows back as ``dtype``: ``x * scale`` computed in fp32. Any shape."""
    return (x.float() * scale).to(dtype)


def round_trip_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """What a read of ``x`` written to an fp8 cache returns, in ``x``'s dtype (``dequantize(quantize(x))``)."""
    return dequantize_kv(quantize_kv(x, scale), scale, x.dtype)


__all__ = ["FP8_E4M3_MAX", "FP8_KV_DTYPE", "dequantize_kv", "inverse_scale", "is_fp8_kv", "quantize_kv",
           "round_trip_kv"]
