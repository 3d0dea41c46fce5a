"""Skinny GEMM for decode: ``y = x @ W.T (+ b)`` with few rows in ``x`` (book ch. 10: batch-1 decode is a
bandwidth problem; every weight byte is read once per step and the product is nearly free).

At a handful of tokens cuBLAS picks split-K kernels for some shapes (two launches, the reduce reading the
partial sums back) and reaches about 73% of the copy bandwidth on the attention projections of an 8B model
(``docs/benchmarks.md``). This kernel gives each program ``BLOCK_N`` whole output columns over the full ``K``:
one launch, no workspace, the weight streamed through a software pipeline (``num_stages``) into a tensor-core
product with the ``x`` rows padded to 16. The tile is chosen per shape from the table below, measured on an
H200 with ``benchmarks/kernels/bench_gemm.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from brigade_cuda.pdl import pdl_launch


MAX_ROWS = 16  # x rows the kernel takes (tl.dot's smallest M); larger batches go to cuBLAS


@triton.jit
def _skinny_gemm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                        HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr = False):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m[:, None] < M
    n_ok = offs_n[:, None] < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    if USE_PDL:  # see brigade_cuda/pdl.py: wait for the previous kernel first, then let the next one launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_ok, other=0.0)
            w = tl.load(w_ptrs, mask=n_ok, other=0.0)
        else:
            k_ok = offs_k[None, :] < K - k * BLOCK_K
            x = tl.load(x_ptrs, mask=m_ok & k_ok, other=0.0)
            w = tl.load(w_ptrs, mask=n_ok & k_ok, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok & (offs_n[None, :] < N))


# (block_n, block_k, num_warps, num_stages) by weight shape "NxK", measured at one row on an H200 by
# benchmarks/kernels/bench_gemm.py --write-tiles; shapes not listed take DEFAULT_TILE.
DEFAULT_TILE = (32, 256, 4, 4)
TILES_FILE = Path(__file__).with_name("gemm_tiles.json")
TILES: dict[str, tuple[int, int, int, int]] = (
    {k: tuple(v) for k, v in json.loads(TILES_FILE.read_text())["tiles"].items()} if TILES_FILE.exists() else {})


def _tile(n: int, k: int) -> tuple[int, int, int, int]:
    return TILES.get(f"{n}x{k}", DEFAULT_TILE)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  tile: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for at most ``MAX_ROWS`` rows.

    Args:
        x: [M, K] fp16/bf16, M <= 16, last dimension contiguous.
        weight: [N, K], same dtype, last dimension contiguous.
        bias: optional [N].
        tile: (block_n, block_k, num_warps, num_stages); default from ``TILES`` by shape.

    Returns: a new [M, N] tensor in x's dtype (fp32 accumulation).

    Raises:
        ValueError: on more than 16 rows, mismatched shapes or dtypes, or a non-contiguous last dimension.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"skinny_linear needs x [M, K] and weight [N, K], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if x.shape[0] > MAX_ROWS or x.dtype != weight.dtype or x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"skinny_linear takes at most {MAX_ROWS} fp16/bf16 rows of the weight's dtype")
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("skinny_linear needs contiguous last dimensions")
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    block_n, block_k, num_warps, num_stages = tile or _tile(n, k)
    _skinny_gemm_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else y, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages, **pdl_launch())
    return y
