"""What the weight-only quantized GEMMs of the quantization plugins (brigade-awq, brigade-gptq) share on CUDA:
the tile buckets, the split-K decision and the split-K partial sum.

Each plugin's kernel dequantizes its own packing inside the K loop; both tile the output the same way and, for
decode-sized batches whose output tiles leave the SMs underfed, split K into slices whose fp32 partial tiles go to
a ``[split_k, M, N]`` workspace that ``split_k_sum`` adds up in a fixed order (deterministic: no atomics), with
the bias, in the output's dtype. Design after vLLM's ``awq_triton.py`` (split-K with a summed workspace); the
numbers are from ``benchmarks/kernels/bench_awq_gemm.py`` and ``bench_gptq_gemm.py`` on an H200.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["stride_ws"])  # M * N: its divisibility must not follow the batch size
def _split_k_sum_kernel(ws_ptr, b_ptr, y_ptr, N, stride_ws, stride_ym,
                        SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # Row pid(0) of y: the sum over the split-K partials (in split order), plus bias, in y's dtype.
    row = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    offs = pid_n * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        total += tl.load(ws_ptr + s * stride_ws + row * N + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        total += tl.load(b_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + offs, total.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def store_output_tile(acc, y_ptr, b_ptr, offs_m, offs_n, m_ok, n_ok, pid_s, N, stride_ym, stride_ys,
                      SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    """A GEMM program's fp32 ``[BLOCK_M, BLOCK_N]`` tile: with one slice, plus bias, into ``y`` in its dtype; with
    split-K, as is into workspace slice ``pid_s`` (``[SPLIT_K, M, N]``, contiguous; ``split_k_sum`` adds them)."""
    out_ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_ok)
    else:
        y_ptrs = y_ptr + pid_s.to(tl.int64) * stride_ys + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(y_ptrs, acc, mask=out_ok)


def choose_tile(m: int, n: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` for ``m`` rows of ``x`` and ``n`` output columns.

    Decode-sized batches (at most 16 rows) take narrow N tiles so that more programs stream the weight; larger
    batches reuse each dequantized tile over more rows, wide outputs (gate_up) with wider N tiles. Chosen from
    the tile sweep of ``benchmarks/kernels/bench_gptq_gemm.py`` on an H200 (Llama-3.1-8B shapes, 4-bit g128;
    ``benchmarks/kernels/results/h200_bench_gptq_gemm_sweep.json``), used for AWQ's layout as well. fp32 (IEEE
    dot) takes smaller tiles.
    """
    if dtype == torch.float32:
        return (16 if m <= 16 else 64), 64, 32, 4, 2
    if m <= 16:
        return 16, 32, 128, 4, 3
    if m <= 64:
        return 64, 64, 64, 4, 3
    return (128, 256, 64, 8, 3) if n >= 16384 else (128, 128, 64, 8, 3)


def choose_split_k(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int, num_sms: int,
                   min_k: int = 0, *, max_rows: int = 16, min_steps: int = 8) -> int:
    """How many slices of K to run in parallel (1, 2, 4 or 8): more only for decode-sized batches (at most
    ``max_rows`` rows) with at least ``min_k`` rows of K whose output tiles leave fewer than two programs per SM
    (doubling while they do), as long as every slice keeps at least ``min_steps`` K steps.

    For Llama-3.1-8B decode on a 132-SM GPU it gives down_proj (K 14336, N 4096: 128 tiles of 32 columns) 4,
    o_proj (4096 x 4096) 4 and qkv (6144 columns) 2; gate_up (28672 columns) stays at 1. brigade-gptq passes
    ``min_k`` 8192: its kernel gained from split-K only on down_proj's tall K and lost at K 4096. The timings of
    ``benchmarks/kernels/bench_awq_gemm.py`` and ``bench_gptq_gemm.py`` behind these choices are in
    ``docs/performance-notes.md``.
    """
    if m > max_rows or k < min_k:
        return 1
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    steps = triton.cdiv(k, block_k)
    split = 1
    while split < 8 and tiles * split < 2 * num_sms and steps // (2 * split) >= min_steps:
        split *= 2
    return split


def split_k_slices(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """``(split_k, k_per_split)`` as launched: no empty slice, each slice whole K steps (``k_per_split`` a
    multiple of ``block_k``), so the count may come out below the one asked.

    Raises:
        ValueError: ``split_k`` is not a power of two of at least 1.
    """
    if split_k < 1 or split_k & (split_k - 1):
        raise ValueError(f"split_k must be a power of two >= 1, not {split_k}")
    steps = triton.cdiv(k, block_k)
    k_per_split = triton.cdiv(steps, min(split_k, steps)) * block_k
    return triton.cdiv(k, k_per_split), k_per_split


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """The SM count ``choose_split_k`` plans for: the device's, or an H200's 132 for CPU tensors (the interpreter),
    so the CPU tests take the decisions an H200 would."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_packed_operands(**packed: torch.Tensor) -> None:
    """Raise ValueError naming the first packed operand (``qweight``, ``qzeros``, ``scales``: 2-D) without unit
    stride along N, which the GEMM kernels index as contiguous."""
    for name, tensor in packed.items():
        if tensor.stride(1) != 1:
            raise ValueError(f"{name} must have unit stride along N")


def output_for(x: torch.Tensor, n: int, out: torch.Tensor | None) -> torch.Tensor:
    """The GEMM's ``[M, N]`` output in x's dtype: ``out`` once checked, or a new tensor when it is None.

    Raises:
        ValueError: ``out`` is not ``[M, N]`` in x's dtype with unit stride along N.
    """
    m = x.shape[0]
    if out is None:
        return torch.empty(m, n, dtype=x.dtype, device=x.device)
    if out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n}] {x.dtype} with unit stride along N")
    return out


def split_k_workspace(split_k: int, m: int, n: int, device: torch.device) -> torch.Tensor:
    """The fp32 ``[split_k, M, N]`` partial tiles of a split-K launch (contiguous)."""
    return torch.empty(split_k, m, n, dtype=torch.float32, device=device)


def split_k_sum(workspace: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """``out = workspace.sum(0) (+ bias)`` in out's dtype, summing the slices in order.

    Args:
        workspace: fp32 [split_k, M, N], contiguous. bias: [N] (unit stride) or None.
        out: [M, N] with unit stride along N.
    """
    split_k, m, n = workspace.shape
    block = 256
    _split_k_sum_kernel[(m, triton.cdiv(n, block))](
        workspace, bias if bias is not None else workspace, out, n, workspace.stride(0), out.stride(0),
        SPLIT_K=split_k, HAS_BIAS=bias is not None, BLOCK=block, num_warps=2)


__all__ = ["check_packed_operands", "choose_split_k", "choose_tile", "num_sms", "output_for", "split_k_slices",
           "split_k_sum", "split_k_workspace", "store_output_tile"]
