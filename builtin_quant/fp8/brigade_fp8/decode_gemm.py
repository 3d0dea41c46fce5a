"""FP8 linear layers at decode sizes on CUDA: the W8A16 kernels, registered through ``register_kernels``.

At a handful of tokens a step's cost is the weight read, so the activations stay in the model dtype (no
quantization kernel, no FP8 scale of x) and the kernel reads each ``float8_e4m3fn`` weight byte once, widens it in
registers, accumulates in fp32 and scales each output channel in the epilogue:
``y[t, n] = weight_scale[n] * sum_k x[t, k] * qw[n, k] (+ bias[n]) (+ residual[t, n])``. These are the bf16 decode
kernels of brigade-cuda (``brigade_cuda.ops.gemm``, one Triton source with a constexpr switch, so the bf16
variants compile exactly as before) with an FP8 weight:

* one row: the CUDA-core GEMV (fp32 partial products in registers over the whole K, reduced once), also with
  SiLU-and-mul computed from the gate/up row while it loads it (the down projection: the activation kernel
  disappears) and the residual add in the epilogue (o_proj and down_proj);
* 2 to ``BRIGADE_FP8_DECODE_ROWS`` rows (default and most 16, tl.dot's smallest M): the tensor-core skinny GEMM,
  the FP8 tile widened to the activations' dtype before ``tl.dot``, with the residual epilogue;
* above, and for the layouts these do not take, None: the layer runs ``gemm.fp8_gemm_cuda`` (per-token FP8
  activations and ``torch._scaled_mm``, where FP8 tensor cores pay).

The RMSNorm fold of the bf16 path is not carried over: folding the norm's weight into an FP8 weight means
quantizing it a second time (a second e4m3 rounding of every weight), and a static ``input_scale`` would no
longer describe the layer's input; FP8 projections keep their norm kernels. Block-scaled weights (128x128
blocks) keep ``gemm.fp8_block_gemm``. Design after vLLM's W8A16 FP8 fallback (``fp8_marlin``: FP8 weights
dequantized in the GEMM with bf16 activations) and the bf16 decode kernels' own notes in ``docs/performance-notes.md``.
"""

from __future__ import annotations

import functools

import torch

from brigade_cuda.ops.gemm import MAX_ROWS, check_residual, check_skinny, gemv, skinny_linear

from brigade_fp8 import envs


@functools.cache
def decode_rows() -> int:
    """The most rows the decode kernels take (``BRIGADE_FP8_DECODE_ROWS``, clamped to 0..16)."""
    return max(0, min(MAX_ROWS, envs.BRIGADE_FP8_DECODE_ROWS))


def _takes(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, k_factor: int = 1) -> bool:
    return 0 < x.shape[0] <= decode_rows() and check_skinny(x, qweight, k_factor=k_factor,
                                                             weight_scale=weight_scale) is None


def fp8_decode_gemm(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor,
                    bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x @ (qweight * weight_scale[:, None]).T + bias`` for decode-sized ``x``, or None (the caller's W8A8 path).

    Args:
        x: [T, K] fp16/bf16/fp32, last dimension contiguous; taken for 1 <= T <= ``decode_rows()``.
        qweight: [N, K] ``float8_e4m3fn``, last dimension contiguous.
        weight_scale: [N] fp32 contiguous (per-tensor checkpoints arrive expanded to their rows).
        bias: [N] or None.

    Returns: a new [T, N] tensor in x's dtype, or None for a shape or layout the kernels do not take.
    """
    if not _takes(x, qweight, weight_scale):
        return None
    if x.shape[0] == 1:
        return gemv(x, qweight, bias, weight_scale=weight_scale)
    return skinny_linear(x, qweight, bias, weight_scale=weight_scale)


def fp8_silu_mul_gemm(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                      *, residual: torch.Tensor | None = None) -> torch.Tensor | None:
    """``silu(x[:, :K]) * x[:, K:] @ W.T + bias (+ residual)`` in one GEMV for one row (the down projection of a
    SwiGLU MLP), W as in ``fp8_decode_gemm``; None otherwise (the caller runs the activation, then the product).

    Args: x [1, 2K] gate then up; residual [1, N] in x's dtype or None. Returns a new [1, N] tensor or None.
    """
    if x.shape[0] != 1 or not _takes(x, qweight, weight_scale, k_factor=2) or not _residual_ok(residual, x, qweight):
        return None
    return gemv(x, qweight, bias, silu_mul=True, residual=residual, weight_scale=weight_scale)


def fp8_residual_gemm(x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                      residual: torch.Tensor) -> torch.Tensor | None:
    """``residual + (x @ W.T + bias)`` with the add in the epilogue (the product rounded to x's dtype first, HF's
    order), W as in ``fp8_decode_gemm``; None for what ``fp8_decode_gemm`` refuses or a residual that is not a
    contiguous [T, N] tensor in x's dtype (the next norm's fused add then adds)."""
    if not _takes(x, qweight, weight_scale) or not _residual_ok(residual, x, qweight):
        return None
    if x.shape[0] == 1:
        return gemv(x, qweight, bias, residual=residual, weight_scale=weight_scale)
    return skinny_linear(x, qweight, bias, residual=residual, weight_scale=weight_scale)


def _residual_ok(residual: torch.Tensor | None, x: torch.Tensor, qweight: torch.Tensor) -> bool:
    return residual is None or check_residual(residual, x, qweight) is None
