"""Triton GEMM on AWQ-packed weights: ``y = x @ W (+ bias)``, the weight dequantized inside the K loop.

Layout (AutoAWQ's ``WQLinear_GEMM``; see ``packing``): for ``x`` [M, K] and ``N`` output columns,

* ``qweight`` int32 [K, N / 8]: row ``k`` of the 4-bit codes, packed along N in AutoAWQ's interleaved order:
  nibble ``i`` (bits ``[4 i, 4 i + 4)``) of word ``c`` holds column ``8 c + AWQ_ORDER[i]``,
  ``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]``; so column ``8 c + j`` sits at bit ``4 * AWQ_REVERSE_ORDER[j]``,
  ``AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]``, which is ``j // 2 + 4 * (j % 2)``.
* ``qzeros`` int32 [G, N / 8], ``G = K / group_size``: each group's zero point per column, packed the same way.
* ``scales`` [G, N] (float16 in checkpoints).
* ``W[k, n] = (q[k, n] - zero[k // group_size, n]) * scales[k // group_size, n]``.

Algorithm: each program owns a ``[BLOCK_M, BLOCK_N]`` tile of ``y`` (``BLOCK_N`` a multiple of 8, so a tile
starts on a word boundary) and walks its share of K in steps of ``BLOCK_K`` rows. Per step it loads the
``[BLOCK_K, BLOCK_N / 8]`` words of ``qweight`` that cover the tile (one load per word), widens them to
``[BLOCK_K, BLOCK_N]`` by interleaving each word with itself three times (every word repeated 8 times in column
order), shifts column ``j`` of each 8 right by ``4 * AWQ_REVERSE_ORDER[j]`` and masks the nibble; the zeros get
the same treatment. ``(q - zero) * scale`` is formed in fp32, rounded once to x's dtype (so the tile equals
``packing.dequantize(..., dtype=x.dtype)`` bit for bit) and fed to a tensor-core ``tl.dot`` with an fp32
accumulator. The dequantized weight never reaches memory: the kernel streams a quarter of an fp16 weight's bytes.

Groups: when ``BLOCK_K`` divides ``group_size`` (the host lowers ``BLOCK_K`` to 64, 32 or 16 to make it so, or the
layer has one group) a step never straddles two groups, and one ``[BLOCK_N]`` row of zeros and scales serves it.
Otherwise (a group size that no power of two from 16 up divides, e.g. 8 or 24) each row's group is loaded per row
(``[BLOCK_K, BLOCK_N]`` zeros and scales, masked at the K tail). N and K tails are masked.

Split-K (``split_k > 1``): program ``(n, m, s)`` covers rows ``[s * Ks, (s + 1) * Ks)`` of K (``Ks`` a multiple of
``BLOCK_K``) and writes its fp32 partial tile to a ``[split_k, M, N]`` workspace; brigade-cuda's ``split_k_sum``
adds the partials in a fixed order (deterministic: no atomics), with the bias, in x's dtype. It exists for
decode: a few rows against a tall K (down_proj's 14336) leave too few programs per SM to hide the loads. The tile
buckets, the split decision and the sum are shared with brigade-gptq (``brigade_cuda.ops.quant_gemm``).

fp32 activations use ``input_precision="ieee"`` (no TF32), so fp32 results track a float32 matmul closely. The GEMM
kernel is marked ``do_not_specialize`` on M, and both kernels on the split-K workspace's stride (``M * N``), so
row counts compile no new variants beyond one per row bucket of ``choose_tile`` (at most 16, 17 to 64, more).

Sources (design references; the code here is written for Brigade): AutoAWQ's GEMM layer and its CUDA kernel
(``awq/modules/linear/gemm.py``, ``awq/utils/packing_utils.py``: the interleaved order) and vLLM's
``vllm/model_executor/layers/quantization/awq_triton.py`` (the self-interleave widening and split-K with a
summed workspace); the tile structure follows ``brigade_gptq.triton_gemm``. Imported only on CUDA hosts
(``method.kernel_for_device``), but importable anywhere Triton is installed (and run by the CPU tests under
``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brigade_cuda.ops.quant_gemm import (check_packed_operands, choose_split_k, choose_tile, num_sms, output_for,
                                         split_k_slices, split_k_sum, split_k_workspace, store_output_tile)


# Batch sizes must not compile variants mid-serving: M, and the workspace's split stride M * N (whose divisibility
# by 16 would otherwise follow M's parity when N is not a multiple of 16).
@triton.jit(do_not_specialize=["M", "stride_ys"])
def _awq_gemm_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, y_ptr, M, N, K, group_size, k_per_split,
                     stride_xm, stride_qwk, stride_qzg, stride_sg, stride_ym, stride_ys,
                     PER_ROW_GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                     SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    WORDS_N: tl.constexpr = BLOCK_N // 8
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = pid_n * WORDS_N + tl.arange(0, WORDS_N)  # the tile's word columns of qweight / qzeros
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    w_ok = offs_w < N // 8  # N is a multiple of 8: word masks are exact
    # Column j of each 8 (the tile starts on a word) sits in nibble j // 2 + 4 * (j % 2) (AWQ_REVERSE_ORDER).
    j = tl.arange(0, BLOCK_N) % 8
    shifts = ((j // 2 + (j % 2) * 4) * 4)[None, :]  # [1, BLOCK_N]
    k_start = pid_s * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        rows = k0 + offs_k
        k_ok = rows < K
        if PER_ROW_GROUPS:
            g = (rows // group_size)[:, None]  # [BLOCK_K, 1]; masked past K
            zw = tl.load(qz_ptr + g * stride_qzg + offs_w[None, :], mask=k_ok[:, None] & w_ok[None, :], other=0)
            s = tl.load(s_ptr + g * stride_sg + offs_n[None, :], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        else:
            g = k0 // group_size  # the step lies inside one group: one [1, BLOCK_N] row of zeros and scales
            zw = tl.load(qz_ptr + g * stride_qzg + offs_w[None, :], mask=w_ok[None, :], other=0)
            s = tl.load(s_ptr + g * stride_sg + offs_n[None, :], mask=n_ok[None, :], other=0.0)
        zw = tl.interleave(zw, zw)
        zw = tl.interleave(zw, zw)
        zw = tl.interleave(zw, zw)  # each word repeated 8 times: one per column it holds
        z = (zw >> shifts) & 0xF
        qw = tl.load(qw_ptr + rows[:, None].to(tl.int64) * stride_qwk + offs_w[None, :],
                     mask=k_ok[:, None] & w_ok[None, :], other=0)  # [BLOCK_K, BLOCK_N / 8]
        qw = tl.interleave(qw, qw)
        qw = tl.interleave(qw, qw)
        qw = tl.interleave(qw, qw)  # [BLOCK_K, BLOCK_N]
        q = (qw >> shifts) & 0xF
        w = ((q - z).to(tl.float32) * s.to(tl.float32)).to(x_ptr.dtype.element_ty)  # [BLOCK_K, BLOCK_N]
        a = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + rows[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
    store_output_tile(acc, y_ptr, b_ptr, offs_m, offs_n, m_ok, n_ok, pid_s, N, stride_ym, stride_ys, SPLIT_K, HAS_BIAS)


def block_k_for_groups(block_k: int, group_size: int, groups: int) -> tuple[int, bool]:
    """``(BLOCK_K, per_row_groups)``: the tile's ``block_k`` when it divides ``group_size`` (or the layer has one
    group), else the largest of 64, 32, 16 below it that does (one zero/scale row per K step); when none does,
    ``block_k`` with per-row group loads."""
    if groups == 1:
        return block_k, False
    for bk in (block_k, 64, 32, 16):
        if bk <= block_k and group_size % bk == 0:
            return bk, False
    return block_k, True


def _check_shapes(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                  bias: torch.Tensor | None, group_size: int) -> tuple[int, int, int, int]:
    """``(M, K, N, groups)`` of one AWQ layer's operands (see ``awq_gemm``); ValueError when they describe none."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"awq_gemm takes float16, bfloat16 or float32 activations, not {x.dtype}")
    if x.dim() != 2 or qweight.dim() != 2 or qzeros.dim() != 2 or scales.dim() != 2:
        raise ValueError("awq_gemm takes a 2-D x and 2-D qweight, qzeros and scales")
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ValueError(f"qweight and qzeros must be int32, not {qweight.dtype} and {qzeros.dtype}")
    m, k = x.shape
    n = qweight.shape[1] * 8
    if group_size <= 0 or k % group_size:
        raise ValueError(f"group_size {group_size} does not divide K {k}")
    groups = k // group_size
    if qweight.shape[0] != k or scales.shape != (groups, n) or qzeros.shape != (groups, n // 8):
        raise ValueError(f"AWQ shapes do not match: x {tuple(x.shape)}, qweight {tuple(qweight.shape)}, qzeros "
                         f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)}, group_size {group_size}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must be [{n}], not {tuple(bias.shape)}")
    return m, k, n, groups


def awq_gemm(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
             bias: torch.Tensor | None = None, *, group_size: int, out: torch.Tensor | None = None,
             tile: tuple[int, int, int, int, int] | None = None, split_k: int | None = None) -> torch.Tensor:
    """``x @ W (+ bias)`` for the AWQ weight ``W[k, n] = (q[k, n] - zero[k // gs, n]) * scales[k // gs, n]``.

    Args:
        x: [M, K] float16, bfloat16 or float32 (CUDA; CPU tensors only under ``TRITON_INTERPRET=1``).
        qweight: int32 [K, N / 8]; qzeros: int32 [K / group_size, N / 8]; scales: [K / group_size, N] float
            (fp16 in checkpoints). See the module docstring for the packing. Unit stride along N.
        bias: [N] or None. group_size: rows per group, dividing K (K itself for one group).
        out: [M, N] in x's dtype with unit stride along N, or None to allocate.
        tile: ``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` instead of ``choose_tile``'s (tests and
            the benchmark); powers of two, ``BLOCK_N`` and ``BLOCK_K`` at least 16. ``BLOCK_K`` may still be
            lowered to divide ``group_size`` (``block_k_for_groups``).
        split_k: K slices (power of two, >= 1) instead of ``choose_split_k``'s.

    Returns:
        [M, N] in x's dtype (``out`` when given).

    Raises:
        ValueError: shapes that do not describe one AWQ layer, or an unsupported dtype.
    """
    m, k, n, groups = _check_shapes(x, qweight, qzeros, scales, bias, group_size)
    if x.stride(1) != 1:
        x = x.contiguous()
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    check_packed_operands(qweight=qweight, qzeros=qzeros, scales=scales)
    out = output_for(x, n, out)
    if m == 0:
        return out
    block_m, block_n, block_k, num_warps, num_stages = tile or choose_tile(m, n, x.dtype)
    if block_n % 8 or min(block_m, block_n, block_k) < 16:
        raise ValueError(f"tile {tile}: BLOCK_N must be a multiple of 8 and BLOCK_M, BLOCK_N, BLOCK_K at least 16")
    block_k, per_row = block_k_for_groups(block_k, group_size, groups)
    if split_k is None:
        split_k = choose_split_k(m, n, k, block_m, block_n, block_k, num_sms(x.device))
    split_k, k_per_split = split_k_slices(k, block_k, split_k)  # raises on a split_k that is no power of two
    dest = out if split_k == 1 else split_k_workspace(split_k, m, n, x.device)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), split_k)
    _awq_gemm_kernel[grid](
        x, qweight, qzeros, scales, bias if bias is not None else scales, dest, m, n, k, group_size, k_per_split,
        x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0), dest.stride(-2), dest.stride(0),
        PER_ROW_GROUPS=per_row, HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32, SPLIT_K=split_k,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)
    if split_k > 1:
        split_k_sum(dest, bias, out)
    return out
