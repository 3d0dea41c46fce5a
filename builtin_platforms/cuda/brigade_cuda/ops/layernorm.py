"""RMSNorm and fused residual-add RMSNorm in Triton (Zhang & Sennrich 2019; the fusion is vLLM's
``fused_add_rms_norm`` custom op: one pass over memory).

One program per token row. The row is read once, the residual sum is written back in place, and the
normalized row is written over ``x``: a decoder layer's ``x + residual -> norm`` costs two reads and
two writes of the hidden state instead of four reads and three writes. Rounding follows the native op
in ``brigade.model_executor.layers.layernorm``: statistics in fp32, the normalized value rounded to the
input dtype before the weight multiply (as HF's LlamaRMSNorm does).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brigade_cuda.pdl import gdc_prologue, pdl_launch, pdl_prefetch


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, eps, hidden,
    stride_x, stride_residual, stride_out,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr = False, PDL_EARLY: tl.constexpr = False, PREFETCH: tl.constexpr = False,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    if PREFETCH or not USE_PDL:  # no kernel writes the weight: its load may precede the wait (pdl.py)
        w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if USE_PDL:  # see brigade_cuda/pdl.py: wait for the previous kernel, let the next one launch
        gdc_prologue(PDL_EARLY)
    if USE_PDL and not PREFETCH:
        w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(residual_ptr + row * stride_residual + cols, x.to(residual_ptr.dtype.element_ty), mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / hidden + eps)
    # Round to the output dtype before scaling by the weight, like the native op does.
    y = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor,
            eps: float) -> None:
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    if rows == 0:
        return
    for name, t in (("x", x), ("out", out), ("residual", residual)):
        if t is not None and (t.stride(-1) != 1 or t.dim() != 2):
            raise ValueError(f"rms_norm needs a 2-D {name} with a contiguous last dimension")
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(rows,)](
        x, residual if residual is not None else x, weight, out, eps, hidden,
        x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=min(16, max(1, block // 256)),
        PREFETCH=pdl_prefetch(), **pdl_launch(),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last dimension.

    Args:
        x: [num_tokens, hidden] fp16/bf16/fp32, last dimension contiguous.
        weight: [hidden]. eps: added to the mean square.

    Returns:
        A new [num_tokens, hidden] tensor in x's dtype.
    """
    out = torch.empty((x.shape[0], x.shape[-1]), dtype=x.dtype, device=x.device)
    _launch(x, None, weight, out, eps)
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: ``residual <- x + residual``, then ``x <- rms_norm(residual)``.

    The norm uses the fp32 sum (before it is rounded into ``residual``), matching the native op.

    Args:
        x, residual: [num_tokens, hidden], same dtype, last dimension contiguous; both overwritten.
        weight: [hidden]. eps: added to the mean square.

    Returns:
        ``(x, residual)``, the same tensor objects, now holding the normalized rows and the sums.
    """
    _launch(x, residual, weight, x, eps)
    return x, residual
