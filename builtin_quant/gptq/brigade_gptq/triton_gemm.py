"""Triton GEMM on GPTQ-packed weights: ``y = x @ dequant(qweight).T (+ b)``, the weight dequantized in the K loop.

Each program owns a ``[BLOCK_M, BLOCK_N]`` tile of ``y`` and walks K in steps of ``BLOCK_K`` rows: it loads
``BLOCK_K / pack`` int32 words per column of ``qweight`` (``pack = 32 / bits`` codes each, little end first:
row ``k`` sits in word ``k // pack`` at bit ``bits * (k % pack)``), shifts and masks them to the codes, loads the
zero and scale of each row's group (the zero unpacked from ``qzeros`` the same way along N, plus ``zero_offset``:
1 for AutoGPTQ's v1 zeros), forms ``(q - zero) * scale`` in fp32, rounds it once to x's dtype and feeds it to a
tensor-core ``tl.dot`` with an fp32 accumulator. The dequantized weight never reaches memory: the kernel reads
``bits / 16`` of an fp16 weight's bytes, which is the point of weight-only quantization in a memory-bound
decode step (design after AutoGPTQ's ``triton`` QuantLinear and vLLM's GPTQ kernels).

Split-K (``split_k > 1``, decode-sized batches whose output tiles underfeed the SMs, with K of at least
``SPLIT_K_MIN_K`` rows: measured on an H200 it pays on down_proj's 14336 and costs at 4096; ``choose_split_k``): program
``(n, m, s)`` covers one slice of K and writes an fp32 partial tile to a ``[split_k, M, N]`` workspace that
``split_k_sum`` adds up in order, with the bias. The tile buckets, the split decision and the sum are shared with
brigade-awq (``brigade_cuda.ops.quant_gemm``).

Groups: with act-order (``desc_act``) checkpoints a row's group is ``g_idx[k]``, loaded per row, and the zeros and
scales are gathered per row (``[BLOCK_K, BLOCK_N]``). When ``g_idx`` is ``k // group_size`` and a K block never
straddles two groups, the group is one scalar per block and one ``[BLOCK_N]`` row of zeros and scales serves it.

fp32 activations use ``input_precision="ieee"`` (no TF32), so fp32 results match a float32 matmul closely.
Imported only on CUDA hosts (``method.kernel_for_device``), but importable anywhere Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brigade_cuda.ops.quant_gemm import (check_packed_operands, choose_split_k, choose_tile, num_sms, output_for,
                                         split_k_slices, split_k_sum, split_k_workspace, store_output_tile)


# Batch sizes must not compile variants mid-serving: M, and the split-K workspace's stride M * N.
SPLIT_K_MIN_K = 8192  # shorter K runs unsplit by default (docs/performance-notes.md)


@triton.jit(do_not_specialize=["M", "stride_ys"])
def _gptq_gemm_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, g_ptr, b_ptr, y_ptr, M, N, K, group_size, k_per_split,
                      stride_xm, stride_qwk, stride_qzg, stride_sg, stride_ym, stride_ys,
                      BITS: tl.constexpr, PACK: tl.constexpr, MAXQ: tl.constexpr, ZERO_OFFSET: tl.constexpr,
                      PER_ROW_GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                      SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    k_start = pid_s * k_per_split  # a multiple of BLOCK_K, so of PACK
    k_end = tl.minimum(k_start + k_per_split, K)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k_start + offs_k)[None, :]
    qw_ptrs = qw_ptr + ((k_start + offs_k)[:, None] // PACK).to(tl.int64) * stride_qwk + offs_n[None, :]
    shift_k = ((offs_k % PACK) * BITS)[:, None]  # [BLOCK_K, 1]: each row's field in its word
    shift_n = ((offs_n % PACK) * BITS)[None, :]  # [1, BLOCK_N]: each column's field in its qzeros word
    qz_cols = (offs_n // PACK)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k_ok = (k0 + offs_k) < K
        if PER_ROW_GROUPS:
            g = tl.load(g_ptr + k0 + offs_k, mask=k_ok, other=0)[:, None]  # [BLOCK_K, 1]
        else:
            g = k0 // group_size  # the block lies inside one group
        s = tl.load(s_ptr + g * stride_sg + offs_n[None, :], mask=n_ok[None, :], other=0.0).to(tl.float32)
        z = tl.load(qz_ptr + g * stride_qzg + qz_cols, mask=n_ok[None, :], other=0)
        z = ((z >> shift_n) & MAXQ) + ZERO_OFFSET
        q = tl.load(qw_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0)
        q = (q >> shift_k) & MAXQ
        w = ((q - z).to(tl.float32) * s).to(x_ptr.dtype.element_ty)  # [BLOCK_K, BLOCK_N]
        a = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
        x_ptrs += BLOCK_K
        qw_ptrs += (BLOCK_K // PACK) * stride_qwk
    store_output_tile(acc, y_ptr, b_ptr, offs_m, offs_n, m_ok, n_ok, pid_s, N, stride_ym, stride_ys, SPLIT_K, HAS_BIAS)


def _block_k_for_groups(block_k: int, group_size: int, groups: int, trivial_g_idx: bool) -> tuple[int, bool]:
    """``(BLOCK_K, PER_ROW_GROUPS)``: with a trivial ``g_idx``, the largest of ``block_k``, 64 and 32 (at most
    ``block_k``) that divides ``group_size`` (any with one group), read with one zero/scale row per K block;
    otherwise ``block_k`` with a group looked up per row."""
    if trivial_g_idx:
        for bk in sorted({block_k, min(block_k, 64), min(block_k, 32)}, reverse=True):
            if groups == 1 or group_size % bk == 0:
                return bk, False
    return block_k, True


def gptq_gemm(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
              g_idx: torch.Tensor, *, bits: int, zero_offset: int, group_size: int, trivial_g_idx: bool,
              bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
              tile: tuple[int, int, int, int, int] | None = None, split_k: int | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for the GPTQ weight ``W.T[k, n] = (q[k, n] - zero[g_idx[k], n]) * scales[g_idx[k], n]``.

    Args:
        x: [M, K] float16, bfloat16 or float32 on CUDA.
        qweight: int32 [K / pack, N]; qzeros: int32 [groups, N / pack]; scales: [groups, N] float (fp16 in
            checkpoints). Column slices of larger tensors are fine (unit stride along N).
        g_idx: int32 [K], each row's group. bits: 4 or 8. zero_offset: added to each stored zero (1: v1).
        group_size: rows per group (K when the checkpoint's is -1). trivial_g_idx: g_idx is ``k // group_size``,
            which allows one zero/scale row per K block when the block size divides ``group_size``.
        bias: [N] or None. out: [M, N] in x's dtype with unit stride along N, or None to allocate.
        tile: ``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` instead of ``choose_tile``'s (tests and
            benchmarks/kernels/bench_gptq_gemm.py); BLOCK_K a multiple of 32.
        split_k: K slices (power of two, >= 1) instead of ``choose_split_k``'s (decode-sized batches only split).

    Returns:
        [M, N] in x's dtype (``out`` when given).

    Raises:
        ValueError: shapes that do not describe one GPTQ layer, or unsupported bits/dtype.
    """
    if bits not in (4, 8):
        raise ValueError(f"gptq_gemm takes 4- or 8-bit weights, not {bits}-bit")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"gptq_gemm takes float16, bfloat16 or float32 activations, not {x.dtype}")
    pack = 32 // bits
    m, k = x.shape
    n = qweight.shape[1]
    groups = scales.shape[0]
    if qweight.shape[0] * pack != k or scales.shape[1] != n or qzeros.shape != (groups, n // pack) \
            or g_idx.shape != (k,) or n % pack:
        raise ValueError(f"GPTQ shapes do not match: x {tuple(x.shape)}, qweight {tuple(qweight.shape)}, qzeros "
                         f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)}, g_idx {tuple(g_idx.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    check_packed_operands(qweight=qweight, qzeros=qzeros, scales=scales)
    out = output_for(x, n, out)
    if m == 0:
        return out
    block_m, block_n, block_k, num_warps, num_stages = tile or choose_tile(m, n, x.dtype)
    block_k, per_row = _block_k_for_groups(block_k, group_size, groups, trivial_g_idx)
    if split_k is None:
        split_k = choose_split_k(m, n, k, block_m, block_n, block_k, num_sms(x.device), min_k=SPLIT_K_MIN_K)
    split_k, k_per_split = split_k_slices(k, block_k, split_k)  # raises on a split_k that is no power of two
    dest = out if split_k == 1 else split_k_workspace(split_k, m, n, x.device)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), split_k)
    _gptq_gemm_kernel[grid](
        x, qweight, qzeros, scales, g_idx, bias if bias is not None else scales, dest, m, n, k, group_size,
        k_per_split, x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0), dest.stride(-2),
        dest.stride(0),
        BITS=bits, PACK=pack, MAXQ=(1 << bits) - 1, ZERO_OFFSET=zero_offset, PER_ROW_GROUPS=per_row,
        HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32, SPLIT_K=split_k,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)
    if split_k > 1:
        split_k_sum(dest, bias, out)
    return out
