"""The W8A8 FP8 product ``y = (x quantized) @ (W quantized).T * scales + b``, on FP8 tensor cores where there are.

Weights arrive here as ``float8_e4m3fn`` [N, K] with one fp32 scale per output channel ([N]); activations are
quantized on the fly, either per token (dynamic: ``amax(|x[t]|) / 448`` per row) or with a checkpoint's static
per-tensor ``input_scale``. Then, because both scales factor out of the dot product,
``y[t, n] = sx[t] * sw[n] * sum_k qx[t, k] * qw[n, k]``: one FP8 GEMM with a rowwise epilogue.

* CUDA (compute capability >= 8.9, K and N multiples of 16): the per-token quantization is one Triton launch
  (``triton_quant.per_token_quant_fp8``); decode batches up to ``BRIGADE_FP8_TRITON_GEMM_ROWS`` rows (64) multiply
  in brigade-fp8's Triton W8A8 GEMM (``triton_gemm.py``: narrow tiles and split-K, faster than cuBLASLt at
  16 to 64 rows; ``docs/performance-notes.md``), larger ones in ``torch._scaled_mm`` (cuBLASLt FP8 with rowwise
  scaling: ``scale_a`` [M, 1] fp32, ``scale_b`` [1, N] fp32, the weight passed as ``qw.t()``, a column-major
  [K, N] view of the row-major [N, K] matrix, bf16 output). Rowwise scaling constrains only K and N (torch checks
  ``K % 16 == 0`` and both dims of the weight); M needs no padding. The weight is read once, in FP8: half of bf16's
  bytes, which is what makes batch-1 decode faster than bf16. Output in fp16 models is cast from bf16.
* Elsewhere (the CPU, older GPUs, odd shapes): the same arithmetic emulated in fp32, quantizing the activations
  exactly as above and multiplying the dequantized codes, so CPU results show the scheme's real error.

Sources: vLLM's ``Fp8LinearOp`` (w8a8_utils: per-token dynamic activations and ``torch._scaled_mm`` with rowwise
scales) and Micikevicius et al., "FP8 Formats for Deep Learning" (2022).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from brigade_fp8.quantize import (dequantize_fp8_blockwise_to, quantize_fp8_per_group, quantize_fp8_per_token,
                                  quantize_fp8_static)

logger = logging.getLogger(__name__)

Fp8Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"],
                   torch.Tensor]


def fp8_gemm_emulated(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor,
                      input_scale: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """The W8A8 product in fp32 arithmetic (any device).

    Args:
        x: [T, K] float activations.
        qweight: [N, K] ``float8_e4m3fn``; weight_scale: [N] fp32.
        input_scale: None (dynamic per-token activation scales) or a 1-element fp32 static scale.
        bias: [N] or None.

    Returns: [T, N] in x's dtype.
    """
    if input_scale is None:
        qx, sx = quantize_fp8_per_token(x)
    else:
        qx, sx = quantize_fp8_static(x, input_scale), input_scale.float().reshape(1, 1)
    out = F.linear(qx.float(), qweight.float()) * sx * weight_scale.float()[None, :]
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def fp8_gemm_cuda(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor,
                  input_scale: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """``fp8_gemm_emulated``'s contract on FP8 tensor cores (``torch._scaled_mm``, rowwise scales).

    Needs x, qweight on one CUDA device of compute capability >= 8.9, K and N multiples of 16, and
    ``weight_scale`` already shaped [1, N] fp32 contiguous (``Fp8LinearMethod`` stores it so). Returns [T, N] in
    x's dtype (bf16 from the GEMM, cast for fp16 and fp32 models).
    """
    from brigade_fp8.triton_quant import per_token_quant_fp8

    if input_scale is None:
        qx, sx = per_token_quant_fp8(x)
    else:
        qx = quantize_fp8_static(x, input_scale)
        sx = input_scale.float().reshape(1, 1).expand(x.shape[0], 1).contiguous()
    if qx.shape[0] <= triton_gemm_rows():  # decode batches: narrow tiles and split-K keep every SM streaming
        from brigade_fp8.triton_gemm import w8a8_gemm

        return w8a8_gemm(qx, sx, qweight, weight_scale, bias, out_dtype=x.dtype)
    out = torch._scaled_mm(qx, qweight.t(), scale_a=sx, scale_b=weight_scale.reshape(1, -1),
                           bias=None if bias is None else bias.to(torch.bfloat16), out_dtype=torch.bfloat16)
    return out if x.dtype == torch.bfloat16 else out.to(x.dtype)


@functools.cache
def triton_gemm_rows() -> int:
    """The most activation rows ``fp8_gemm_cuda`` gives the Triton W8A8 GEMM (``BRIGADE_FP8_TRITON_GEMM_ROWS``,
    read once); larger batches run ``torch._scaled_mm``."""
    from brigade_fp8 import envs

    return envs.BRIGADE_FP8_TRITON_GEMM_ROWS


def fp8_block_gemm(x: torch.Tensor, qweight: torch.Tensor, block_scale: torch.Tensor, block: tuple[int, int],
                   bias: torch.Tensor | None) -> torch.Tensor:
    """The block-scaled W8A8 product of DeepSeek-V3-style checkpoints, by dequantization (any device).

    Activations are quantized dynamically per ``block[1]``-column group of each token, as the checkpoint's scheme
    says, then both operands are dequantized and multiplied in fp32 on the CPU (in x's dtype on CUDA, where the
    weight is dequantized for each call: correct, but slower than bf16; a block-scaled FP8 GEMM is future work).

    Args: x [T, K]; qweight [N, K] ``float8_e4m3fn``; block_scale [ceil(N / bn), ceil(K / bk)] fp32; bias [N] or
    None. Returns [T, N] in x's dtype.
    """
    compute = torch.float32 if x.device.type == "cpu" else x.dtype
    qx, sx = quantize_fp8_per_group(x, block[1])
    xd = (qx.float() * sx.repeat_interleave(block[1], dim=1)[:, :x.shape[1]]).to(compute)
    out = F.linear(xd, dequantize_fp8_blockwise_to(qweight, block_scale, block, compute))
    if bias is not None:
        out = out + bias.to(compute)
    return out.to(x.dtype)


@functools.cache
def cuda_fp8_supported(device: torch.device) -> bool:
    """True when ``device`` is a CUDA GPU with FP8 tensor cores (compute capability 8.9: Ada, 9.0: Hopper, and up)
    and Triton is importable (for the activation quantization)."""
    if device.type != "cuda":
        return False
    if torch.cuda.get_device_capability(device) < (8, 9):
        return False
    try:
        import brigade_fp8.triton_quant  # noqa: F401
    except ImportError as e:
        logger.warning("brigade-fp8: Triton is not importable (%s): FP8 layers use the emulated fp32 product, "
                       "much slower than bf16 (pip install triton)", e)
        return False
    return True


def fp8_gemm_for(device: torch.device, input_size: int, output_size: int) -> Fp8Gemm:
    """The product for a layer of [output_size, input_size] on ``device``: ``fp8_gemm_cuda`` where FP8 tensor cores
    take the shape (both sizes multiples of 16), else ``fp8_gemm_emulated``."""
    if cuda_fp8_supported(device) and input_size % 16 == 0 and output_size % 16 == 0:
        return fp8_gemm_cuda
    return fp8_gemm_emulated
