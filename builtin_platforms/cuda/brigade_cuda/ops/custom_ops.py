"""The Triton adapters for the model layers' ``CustomOp`` seam on the "cuda" platform,
and the skinny GEMM / one-row GEMV (with SiLU-and-mul folded into the down projection, the RMSNorm into the
qkv and gate/up projections and the residual adds into the epilogues) to the dense-GEMM seam of unquantized
linear layers (``BRIGADE_CUDA_SKINNY_GEMM=0`` keeps cuBLAS everywhere; ``BRIGADE_CUDA_GEMV=0`` keeps the
tensor-core skinny kernel and a separate activation at one row; ``BRIGADE_CUDA_NORM_FOLD=0`` keeps the norm
kernels and the model's norm weights where they are), and the
fused sampler of ``ops/sampling.py`` to the Sampler's plain batches (``BRIGADE_CUDA_FUSED_SAMPLER=0`` turns it
off).

The plugin's ``register_kernels`` hook (``brigade_cuda/plugin.py``) registers each adapter by lazy path for
its op (``brigade.plugins.kernels.KERNEL_OPS``), so this module is imported only when a layer built on a CUDA
device binds it. Each adapter has the same contract as the layer's ``forward_native`` and falls back to it
for the rare layouts the kernels do not address (so results never depend on which path ran, only speed does).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from brigade_cuda import envs
from brigade_cuda.ops.activation import silu_and_mul
from brigade_cuda.ops.gemm import check_residual, check_skinny, gemv, skinny_linear
from brigade_cuda.ops.layernorm import fused_add_rms_norm, rms_norm
from brigade_cuda.ops.rotary import rotary_embedding


def rms_norm_cuda(layer, x: torch.Tensor, residual: torch.Tensor | None = None
                  ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``RMSNorm`` on CUDA: same contract as ``RMSNorm.forward_native``; updates x/residual in place."""
    weight = layer.weight
    same_dtype = weight.dtype == x.dtype and (residual is None or residual.dtype == x.dtype)
    if not same_dtype or x.dim() != 2 or x.stride(-1) != 1 or (residual is not None and (
            residual.shape != x.shape or residual.stride(-1) != 1)):
        return layer.forward_native(x, residual)  # mixed dtypes promote differently; keep native math
    if residual is None:
        return rms_norm(x, weight, layer.variance_epsilon)
    return fused_add_rms_norm(x, residual, weight, layer.variance_epsilon)


def silu_and_mul_cuda(layer, x: torch.Tensor) -> torch.Tensor:
    """``SiluAndMul`` on CUDA: same contract as ``SiluAndMul.forward_native``."""
    if x.stride(-1) != 1 or x.shape[-1] % 2:
        return layer.forward_native(x)
    flat = x.reshape(-1, x.shape[-1])
    return silu_and_mul(flat).reshape(*x.shape[:-1], x.shape[-1] // 2)


def rotary_embedding_cuda(layer, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``RotaryEmbedding`` on CUDA: same contract as its ``forward_native``; rotates in place."""
    if query.stride(-1) != 1 or key.stride(-1) != 1:
        return layer.forward_native(positions, query, key)
    return rotary_embedding(positions, query, key, layer.head_size, layer.cos_sin_cache,
                            is_neox_style=layer.is_neox_style)


def dense_gemm_cuda(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` on CUDA: the Triton one-row GEMV at batch 1, the skinny GEMM for other decode-sized
    batches (<= 16 rows of fp16/bf16), cuBLAS for everything else."""
    if check_skinny(x, weight) is None:
        if x.shape[0] == 1 and _gemv_on():
            return gemv(x, weight, bias)
        return skinny_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def silu_mul_gemm_cuda(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *,
                       residual: torch.Tensor | None = None) -> torch.Tensor | None:
    """``silu_and_mul(x) @ weight.T + bias (+ residual)`` in one GEMV for one row; None (run the ops)
    otherwise."""
    if (x.shape[0] == 1 and _gemv_on() and check_skinny(x, weight, k_factor=2) is None
            and _residual_ok(residual, x, weight)):
        return gemv(x, weight, bias, silu_mul=True, residual=residual)
    return None


def residual_gemm_cuda(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       residual: torch.Tensor) -> torch.Tensor | None:
    """``residual + x @ weight.T + bias`` with the add in the epilogue: the GEMV at one row, the skinny GEMM
    up to 16 rows; None beyond, where cuBLAS makes the product and the next norm's fused add-and-normalize
    kernel adds (``addmm`` with the residual as C measured slower for prefill-sized batches)."""
    if not _residual_ok(residual, x, weight) or check_skinny(x, weight) is not None:
        return None
    if x.shape[0] == 1 and _gemv_on():
        return gemv(x, weight, bias, residual=residual)
    return skinny_linear(x, weight, bias, residual=residual)


def rms_norm_gemm_cuda(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       eps: float) -> torch.Tensor | None:
    """``(x / rms(x)) @ weight.T + bias`` (the RMSNorm's weight folded into ``weight``) in one GEMV for one row;
    None (the norm kernel, then the GEMM) otherwise."""
    if x.shape[0] == 1 and _gemv_on() and check_skinny(x, weight) is None:
        return gemv(x, weight, bias, rms_norm_eps=eps)
    return None


def _residual_ok(residual: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor) -> bool:
    return residual is None or check_residual(residual, x, weight) is None


@functools.cache
def _gemv_on() -> bool:
    return envs.BRIGADE_CUDA_GEMV  # off: the tensor-core kernel at one row too (A/B)
