"""Triton W8A8 FP8 GEMM for decode batches: ``y = (qx * sx) @ (qw * sw).T + b`` on FP8 tensor cores.

Below a few tens of rows, ``torch._scaled_mm`` (cuBLASLt) reads the FP8 weights of a Llama-3.1-8B decode step
well below copy bandwidth (``docs/performance-notes.md``): its 128x128 output tiles leave most SMs idle when the batch is a fraction of a tile. This kernel gives each program a
narrow ``BLOCK_N`` column slice and, where the tiles still underfill the SMs, a slice of K (split-K, partial tiles
summed in order by brigade-cuda's ``split_k_sum``), multiplies e4m3 codes on the tensor cores with fp32
accumulation (``tl.dot`` of two FP8 tiles), and applies the per-token and per-channel scales in the epilogue.
Activations come quantized per token (``triton_quant.per_token_quant_fp8``) or with a static scale expanded to
rows. Design after vLLM's CUTLASS ``scaled_mm`` small-M configurations (narrow N tiles, split-K).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from brigade_cuda.ops.quant_gemm import (choose_split_k, num_sms, split_k_slices, split_k_sum, split_k_workspace,
                                         store_output_tile)


@triton.jit(do_not_specialize=["M"])
def _w8a8_gemm_kernel(qx_ptr, sx_ptr, qw_ptr, sw_ptr, b_ptr, y_ptr, M, N, K, k_per_split, stride_xm, stride_wn,
                      stride_ym, stride_ys, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    k_start = pid_s * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    x_ptrs = qx_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k_start + offs_k)[None, :]
    w_ptrs = qw_ptr + offs_n[:, None].to(tl.int64) * stride_wn + (k_start + offs_k)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + offs_k) < k_end
            a = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    sx = tl.load(sx_ptr + offs_m, mask=m_ok, other=0.0)
    sw = tl.load(sw_ptr + offs_n, mask=n_ok, other=0.0)
    acc = acc * sx[:, None] * sw[None, :]
    store_output_tile(acc, y_ptr, b_ptr, offs_m, offs_n, m_ok, n_ok, pid_s, N, stride_ym, stride_ys, SPLIT_K,
                      HAS_BIAS)


Tile = tuple[int, int, int, int, int, int]  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, split_k)

# Row buckets of the shapes the table lacks (split_k 0: chosen by choose_split_k); measured on an H200 with
# benchmarks/kernels/bench_fp8_w8a8.py, like the table in w8a8_tiles.json.
DEFAULT_TILES: dict[int, Tile] = {16: (16, 64, 256, 4, 4, 0), 32: (32, 64, 128, 4, 5, 0), 64: (64, 64, 256, 4, 5, 0),
                                  128: (64, 64, 128, 4, 5, 1)}


@functools.cache
def tile_table() -> dict[str, dict[int, Tile]]:
    """``w8a8_tiles.json`` beside this module: weight shape ``"NxK"`` -> {rows bucket: tile}; empty if absent."""
    file = Path(__file__).with_name("w8a8_tiles.json")
    raw = json.loads(file.read_text()).get("tiles", {}) if file.exists() else {}
    return {shape: {int(r): tuple(t) for r, t in by_rows.items()} for shape, by_rows in raw.items()}


def pick_tile(rows: int, n: int, k: int, device: torch.device = torch.device("cpu")) -> Tile:
    """The tile for ``rows`` rows of x and weight [n, k]: the table's entry for the smallest row bucket at or above
    ``rows`` (the largest beyond them), else ``DEFAULT_TILES``'s with split-K by brigade-cuda's ``choose_split_k``
    (slices while the output tiles leave fewer than two programs per SM of ``device``, an H200's 132 for a CPU
    tensor, each slice keeping 4 K steps)."""
    by_rows = tile_table().get(f"{n}x{k}") or DEFAULT_TILES
    bucket = min((b for b in by_rows if b >= rows), default=max(by_rows))
    tile = by_rows[bucket]
    if tile[5]:
        return tile
    split = choose_split_k(rows, n, k, tile[0], tile[1], tile[2], num_sms(device), max_rows=max(DEFAULT_TILES),
                           min_steps=4)
    return tile[:5] + (split,)


def w8a8_gemm(qx: torch.Tensor, sx: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor,
              bias: torch.Tensor | None, *, out_dtype: torch.dtype = torch.bfloat16,
              tile: tuple[int, int, int, int, int, int] | None = None) -> torch.Tensor:
    """``(qx * sx) @ (qweight * weight_scale).T + bias`` in ``out_dtype``.

    Args:
        qx: [M, K] ``float8_e4m3fn``, rows contiguous. sx: [M, 1] or [M] fp32 contiguous (per-token scales).
        qweight: [N, K] ``float8_e4m3fn``, rows contiguous. weight_scale: [N] or [1, N] fp32 contiguous.
        bias: [N] or None (added in fp32).
        tile: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, split_k); default ``pick_tile(M, N, K, device)``.

    Returns: a new [M, N] tensor (fp32 accumulation, one rounding).
    """
    m, k = qx.shape
    n = qweight.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=qx.device)
    if m == 0:
        return out
    block_m, block_n, block_k, num_warps, num_stages, split_k = tile or pick_tile(m, n, k, qx.device)
    split_k, k_per_split = split_k_slices(k, block_k, split_k)
    dest = out if split_k == 1 else split_k_workspace(split_k, m, n, qx.device)
    if bias is not None and bias.dtype != torch.float32:
        bias = bias.float()
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), split_k)
    _w8a8_gemm_kernel[grid](
        qx, sx, qweight, weight_scale, bias if bias is not None else sx, dest, m, n, k, k_per_split, qx.stride(0),
        qweight.stride(0), dest.stride(-2), dest.stride(0), HAS_BIAS=bias is not None,
        SPLIT_K=1 if split_k == 1 else 2, EVEN_K=k_per_split % block_k == 0 and k % k_per_split == 0,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)
    if split_k > 1:
        split_k_sum(dest, bias, out)
    return out
