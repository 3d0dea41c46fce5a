"""Triton kernel: dynamic per-token FP8 quantization of activations, e4m3 codes and per-row scales in one launch.

For ``x`` [T, K] (bf16, fp16 or fp32, rows contiguous) one program per row walks the row twice in ``BLOCK``-wide
steps: the first pass takes ``amax(|x[t]|)`` in fp32, the second writes ``clamp(x / s, -448, 448)`` as
``float8_e4m3fn`` with ``s = max(amax / 448, 1e-12)``, and the program stores ``s`` to ``scale[t]``. The second
read of the row hits L2 (a row is at most tens of KiB), so the kernel moves about ``3 K`` bytes per row for bf16
input: the activation read and the FP8 codes written, with no intermediate in HBM. Same rule as the PyTorch
reference ``brigade_fp8.quantize.quantize_fp8_per_token`` (vLLM's ``dynamic_per_token_scaled_fp8_quant``).

Imported only on CUDA hosts (``brigade_fp8.gemm``), but importable anywhere Triton is installed (the CPU tests
run it under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brigade_fp8.quantize import _MIN_SCALE, FP8_DTYPE, FP8_MAX


@triton.jit(do_not_specialize=["T"])
def _per_token_quant_kernel(x_ptr, q_ptr, s_ptr, T, K, stride_x, stride_q,
                            BLOCK: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    q_row = q_ptr + row.to(tl.int64) * stride_q
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, K, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        v = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(v))
    scale = tl.maximum(tl.max(amax, axis=0) / QMAX, MIN_SCALE)
    tl.store(s_ptr + row, scale)
    for start in range(0, K, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < K
        v = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) / scale
        v = tl.minimum(tl.maximum(v, -QMAX), QMAX)
        tl.store(q_row + offs, v.to(q_ptr.dtype.element_ty), mask=mask)


def per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Args: x [T, K] float (last dimension contiguous). Returns (q [T, K] ``float8_e4m3fn``, scale [T, 1] fp32)
    on x's device, ``q * scale`` approximating ``x`` row by row."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    t, k = x.shape
    q = torch.empty((t, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((t, 1), dtype=torch.float32, device=x.device)
    if t == 0:
        return q, scale
    block = min(triton.next_power_of_2(k), 4096)
    _per_token_quant_kernel[(t,)](x, q, scale, t, k, x.stride(0), q.stride(0), BLOCK=block, QMAX=FP8_MAX,
                                  MIN_SCALE=_MIN_SCALE, num_warps=8 if block >= 2048 else 4)
    return q, scale
