"""MXFP4 checkpoint tensors dequantized at load (OCP Microscaling Formats v1.0, 2023: MXFP4 is FP4 E2M1
elements in blocks of 32 that share one E8M0 scale).

gpt-oss's published checkpoints (``quantization_config.quant_method == "mxfp4"``) store each expert projection as
two tensors, as transformers' ``integrations/mxfp4.py`` reads them:

* ``*_blocks`` [..., rows, G, 16] uint8: each row's ``G * 32`` elements, two 4-bit codes a byte, the element of
  even index in the low nibble; a code is an index into ``FP4_VALUES`` (sign bit, then E2M1).
* ``*_scales`` [..., rows, G] uint8: one biased exponent a block of 32 elements, the block's factor
  ``2 ** (scale - 127)``.

Brigade has no MXFP4 kernels: the weights become the model dtype once, here, and run on the bf16 experts.
"""

from __future__ import annotations

import torch

FP4_VALUES = (+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The 16 FP4 (E2M1) values by code."""
MXFP4_BLOCK = 32  # elements sharing one scale
E8M0_BIAS = 127


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``blocks`` [..., rows, G, 16] uint8 and ``scales`` [..., rows, G] uint8 -> [..., rows, G * 32] in ``dtype``
    (transformers' ``_convert_moe_packed_tensors`` without its final transpose: the rows stay the output
    channels). Exact: every FP4 value times a power of two is representable in bf16 and fp32 within range.

    Raises:
        ValueError: shapes that do not pair (``blocks.shape[:-1] != scales.shape``, or a last dimension not 16).
    """
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != MXFP4_BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not pair: "
                         f"expected blocks [..., G, {MXFP4_BLOCK // 2}] and scales [..., G]")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    codes = blocks.to(torch.uint8)
    values = torch.empty(*codes.shape[:-1], MXFP4_BLOCK, dtype=torch.float32, device=blocks.device)
    values[..., 0::2] = lut[(codes & 0x0F).long()]  # even elements: low nibble
    values[..., 1::2] = lut[(codes >> 4).long()]
    exponents = scales.to(torch.int32) - E8M0_BIAS  # [..., rows, G]
    values = torch.ldexp(values, exponents[..., None].float())
    return values.reshape(*codes.shape[:-2], -1).to(dtype)
