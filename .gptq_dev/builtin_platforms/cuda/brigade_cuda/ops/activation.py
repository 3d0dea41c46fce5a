"""SiluAndMul (the SwiGLU gate, Shazeer 2020) in Triton: one read of ``[gate | up]``, one write.

Rounding follows the native op in ``brigade.model_executor.layers.activation``, which runs
``F.silu(gate) * up`` in the model dtype: silu's result is rounded to that dtype before the product.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brigade_cuda.pdl import gdc_prologue, pdl_launch


@triton.jit
def silu_mul(gate, up, DTYPE: tl.constexpr):
    """``silu(gate) * up`` from fp32 inputs, rounded as the native op: silu to ``DTYPE`` first, then the
    product to ``DTYPE``. The one place this rule is written (the kernel below, the one-row GEMV's fold)."""
    act = (gate / (1.0 + tl.exp(-gate))).to(DTYPE).to(tl.float32)
    return (act * up).to(DTYPE)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, d, stride_x, stride_out, BLOCK: tl.constexpr,
                         USE_PDL: tl.constexpr = False, PDL_EARLY: tl.constexpr = False):
    if USE_PDL:  # see brigade_cuda/pdl.py: wait for the previous kernel, let the next one launch
        gdc_prologue(PDL_EARLY)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, silu_mul(gate, up, out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :d]) * x[:, d:]``.

    Args:
        x: [num_tokens, 2 * d] fp16/bf16/fp32, last dimension contiguous (gate first, then up).

    Returns:
        A new [num_tokens, d] tensor in x's dtype.

    Raises:
        ValueError: on a layout the kernel cannot address.
    """
    if x.dim() != 2 or x.stride(-1) != 1 or x.shape[-1] % 2:
        raise ValueError("silu_and_mul needs a 2-D input with an even, contiguous last dimension")
    num_tokens, d = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, d), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    block = min(1024, triton.next_power_of_2(d))
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(d, block))](
        x, out, d, x.stride(0), out.stride(0), BLOCK=block, num_warps=4, **pdl_launch())
    return out
