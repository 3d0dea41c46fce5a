"""Per-output-channel FP8 (e4m3) quantization of a weight matrix, and its inverse.

``float8_e4m3fn`` has 4 exponent bits, 3 mantissa bits and no infinities; its largest finite value
is 448. Scaling each output row by ``amax(row) / 448`` uses the whole range for every channel, so a
value in the normal range (``|w| >= 2**-6 * scale``) is stored with a relative error of at most
``2**-4`` (half a unit in the last of 3 mantissa bits); smaller values fall into the subnormals,
whose absolute error is at most ``2**-10 * scale``. Scheme: the "dynamic" per-channel FP8 weight
quantization of vLLM's ``fp8`` method and of Micikevicius et al., "FP8 Formats for Deep Learning" (2022).
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0

# A row of zeros would get scale 0 and divide by it; any positive floor keeps it exactly zero.
_MIN_SCALE = 1e-12


def quantize_fp8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a ``[out, in]`` weight to FP8 with one fp32 scale per output row.

    Args:
        weight: [out_features, in_features], any floating dtype, any device.

    Returns:
        (qweight, scale): qweight [out, in] ``float8_e4m3fn`` on weight's device; scale [out] float32,
        ``amax(|row|) / 448``, so that ``qweight.float() * scale[:, None]`` approximates ``weight``.

    Raises:
        ValueError: weight is not 2-D or not floating point.
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"expected a 2-D floating weight, got shape {tuple(weight.shape)} dtype {weight.dtype}")
    w = weight.float()
    scale = fp8_scale_from_amax(w.abs().amax(dim=1))
    return quantize_fp8_rows(w, scale), scale


def fp8_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """The per-channel scale ``amax / 448`` (fp32, floored so that a row of zeros stays zero) of rows whose largest
    magnitude is ``amax`` (any shape)."""
    return (amax.float() / FP8_MAX).clamp(min=_MIN_SCALE)


def quantize_fp8_rows(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``weight`` [..., K] divided by ``scale`` [...] (one per row) and rounded to ``float8_e4m3fn`` [..., K]."""
    # The clamp guards against the row maximum rounding just above 448 after the division.
    return (weight.float() / scale.float()[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_fp8_per_channel(qweight: torch.Tensor, scale: torch.Tensor,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of ``quantize_fp8_per_channel``: [out, in] fp8 and [out] fp32 -> [out, in] in ``dtype``."""
    return (qweight.float() * scale.float()[:, None]).to(dtype)


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token activation quantization (the same rule as a weight row): ``x`` [T, K] any float dtype ->
    (q [T, K] ``float8_e4m3fn``, scale [T, 1] float32 ``amax(|x[t]|) / 448``). The PyTorch reference of
    ``brigade_fp8.triton_quant.per_token_quant_fp8``."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=_MIN_SCALE)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantize_fp8_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Static per-tensor activation quantization with a checkpoint's ``input_scale``: ``x`` [T, K] and a 1-element
    fp32 ``scale`` -> ``clamp(x / scale, -448, 448)`` as [T, K] ``float8_e4m3fn`` (values past the calibrated range
    saturate, as in vLLM's static FP8)."""
    return (x.float() / scale.float().reshape(())).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_fp8_blockwise(qweight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Block-scaled FP8 (DeepSeek-V3 / Qwen3-FP8 ``weight_scale_inv``, compressed-tensors ``FP8_BLOCK``) to fp32.

    Args:
        qweight: [N, K] ``float8_e4m3fn``.
        scale: [ceil(N / bn), ceil(K / bk)] fp32; block ``(i, j)`` of the weight is multiplied by ``scale[i, j]``.
        block: (bn, bk), e.g. (128, 128).

    Returns: [N, K] float32.
    """
    return dequantize_fp8_blockwise_to(qweight, scale, block, torch.float32)


def dequantize_fp8_blockwise_to(qweight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                                dtype: torch.dtype) -> torch.Tensor:
    """``dequantize_fp8_blockwise`` computed and returned in ``dtype``; when the blocks tile the weight exactly it
    broadcasts each scale over its block, so the only [N, K] tensor made is the result."""
    n, k = qweight.shape
    bn, bk = block
    if n % bn == 0 and k % bk == 0:
        w = qweight.to(dtype).view(n // bn, bn, k // bk, bk) * scale.to(dtype)[:, None, :, None]
        return w.view(n, k)
    full = scale.to(dtype).repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return qweight.to(dtype) * full


def quantize_fp8_per_group(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token-group activation quantization (DeepSeek-V3's 1x128 tiles, compressed-tensors ``FP8_BLOCK``
    activations): ``x`` [T, K] -> (q [T, K] ``float8_e4m3fn``, scale [T, ceil(K / group)] fp32), each ``group``
    consecutive columns of a row sharing ``amax / 448``."""
    t, k = x.shape
    pad = -k % group
    xf = torch.nn.functional.pad(x.float(), (0, pad)).reshape(t, -1, group)
    scale = (xf.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=_MIN_SCALE)
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).reshape(t, -1)[:, :k]
    return q, scale.squeeze(-1)
