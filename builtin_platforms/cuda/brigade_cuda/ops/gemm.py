"""Skinny GEMM for decode: ``y = x @ W.T (+ b)`` with few rows in ``x`` (batch-1 decode is a
bandwidth problem; every weight byte is read once per step and the product is nearly free).

At a handful of tokens cuBLAS picks split-K kernels for some shapes (two launches, the reduce reading the
partial sums back) and reaches about 73% of the copy bandwidth on the attention projections of an 8B model
(``docs/performance-notes.md``). This kernel gives each program ``BLOCK_N`` whole output columns over the full ``K``:
one launch, no workspace, the weight streamed through a software pipeline (``num_stages``) into a tensor-core
product with the ``x`` rows padded to 16. The tile is chosen per shape from the table below, tuned on an H200
inside a captured step of all the projections with PDL, where it runs (``benchmarks/kernels/tune_skinny_graph.py``;
timed alone, a 20 us kernel's ramp and launch hide the differences that matter in the graph).

A single row (batch-1 decode) takes a second kernel, ``gemv``: no tensor cores and no padding to 16 rows;
each program keeps a ``[BLOCK_N, BLOCK_K]`` fp32 partial product in registers over the whole ``K`` and
reduces it once at the end, so the loop is nothing but wide weight loads and FMAs. It can also compute
its input as ``silu(gate) * up`` from a fused gate/up projection while it loads it (``gemv(silu_mul=True)``):
the activation is then never written to memory and its kernel disappears from the step.

The RMSNorm before the qkv and gate/up projections folds in too, once the model has folded the norm's
weight into the projection (``LlamaForCausalLM.fold_norm_weights``): what is left of the norm is one scalar
per row, ``1 / rms(x)``, and every GEMV program reads the whole row anyway, so it sums the squares while it
streams ``x`` and scales its outputs at the end (``gemv(rms_norm_eps=...)``). The residual add that closes
each branch goes into the epilogue of o_proj and down_proj (``residual=``). Together they remove both norm
kernels of every layer at batch 1. (A first fold also loaded the residual and the norm weight
in every K step and was measured slower, see ``docs/performance-notes.md``.)

Both kernels also take an FP8 weight (``weight_scale=``, the ``W_SCALE`` constexpr): ``float8_e4m3fn`` codes,
one byte per weight read once, widened in registers to fp32 (GEMV) or to x's dtype (tensor-core kernel), and the
fp32 result scaled per output channel in the epilogue, x staying in the model dtype (W8A16). brigade-fp8's decode
kernels (``brigade_fp8/decode_gemm.py``) are these. Everything FP8 sits behind the constexpr (and the scale
pointer defaults to None, a constexpr too), so the bf16 variants compile to the same code as without it. An FP8
weight takes its own tile entries when the table has them (``"NxK/fp8"``), else the bf16 tile of its shape.
"""

from __future__ import annotations

import json
import functools
from pathlib import Path

import torch
import triton
import triton.language as tl

from brigade_cuda import envs
from brigade_cuda.ops.activation import silu_mul
from brigade_cuda.pdl import gdc_prologue, pdl_launch


MAX_ROWS = 16  # x rows the kernel takes (tl.dot's smallest M); larger batches go to cuBLAS
FP8_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # activations an FP8 weight's kernels take


@triton.jit
def _widened_dot(x, w, acc):
    # acc + x @ w.T for an FP8 tile w, widened to x's dtype first; fp32 x multiplies in IEEE fp32 (no TF32).
    w = w.to(x.dtype)
    if x.dtype == tl.float32:
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    else:
        acc = tl.dot(x, tl.trans(w), acc)
    return acc


@triton.jit(do_not_specialize=["M"])  # 16 rows (divisible by 16) must not compile a variant mid-serving
def _skinny_gemm_kernel(x_ptr, w_ptr, b_ptr, r_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, stride_rm,
                        HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr = False, PDL_EARLY: tl.constexpr = False,
                        s_ptr=None, W_SCALE: tl.constexpr = False):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m[:, None] < M
    n_ok = offs_n[:, None] < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    if USE_PDL:  # see brigade_cuda/pdl.py: wait for the previous kernel, let the next one launch
        gdc_prologue(PDL_EARLY)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_ok, other=0.0)
            w = tl.load(w_ptrs, mask=n_ok, other=0.0)
        else:
            k_ok = offs_k[None, :] < K - k * BLOCK_K
            x = tl.load(x_ptrs, mask=m_ok & k_ok, other=0.0)
            w = tl.load(w_ptrs, mask=n_ok & k_ok, other=0.0)
        if W_SCALE:  # FP8 codes, widened to x's dtype in registers (W8A16)
            acc = _widened_dot(x, w, acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if W_SCALE:  # the weight's per-output-channel scale
        acc *= tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    ok = m_ok & (offs_n[None, :] < N)
    if HAS_RESIDUAL:  # the product rounded to the output dtype first, then the add (HF's order)
        r = tl.load(r_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=ok, other=0.0)
        acc = acc.to(y_ptr.dtype.element_ty).to(tl.float32) + r.to(tl.float32)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, r_ptr, y_ptr, N, K, stride_wn, eps,
                 HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, SILU_MUL: tl.constexpr,
                 RMS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr = False, PDL_EARLY: tl.constexpr = False,
                 s_ptr=None, W_SCALE: tl.constexpr = False):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n[:, None] < N
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    if USE_PDL:  # see brigade_cuda/pdl.py: wait for the previous kernel, let the next one launch
        gdc_prologue(PDL_EARLY)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if RMS_NORM:
        sq = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        cols = k * BLOCK_K + offs_k
        if EVEN_K:
            k_ok = offs_k < BLOCK_K  # all true; folded away
        else:
            k_ok = cols < K
        if EVEN_K and EVEN_N:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=n_ok & k_ok[None, :], other=0.0)
        x = tl.load(x_ptr + cols, mask=k_ok, other=0.0)
        if SILU_MUL:  # x holds the gate half; the up half sits K further on
            up = tl.load(x_ptr + K + cols, mask=k_ok, other=0.0).to(tl.float32)
            x = silu_mul(x.to(tl.float32), up, x_ptr.dtype.element_ty)
        xf = x.to(tl.float32)
        if RMS_NORM:  # every program reads all of x: each takes the row's statistics itself
            sq += xf * xf
        acc += w.to(tl.float32) * xf[None, :]
        w_ptrs += BLOCK_K
    y = tl.sum(acc, 1)
    if W_SCALE:  # FP8 codes (widened to fp32 above): the weight's per-output-channel scale
        y *= tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0)
    if RMS_NORM:
        y = y / tl.sqrt(tl.sum(sq, 0) / K + eps)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:  # the product rounded to the output dtype first, then the add (HF's order)
        y = y.to(y_ptr.dtype.element_ty).to(tl.float32) + tl.load(r_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=offs_n < N)


# (block_n, block_k, num_warps, num_stages) by weight shape "NxK", measured on an H200: "tiles" for the
# tensor-core kernel (tune_skinny_graph.py --write-tiles, in a captured step at 8 rows), "gemv_tiles" for the
# one-row kernel (bench_gemm.py --gemv-only); shapes not listed take the defaults. BRIGADE_CUDA_GEMM_TILES
# names another file.
DEFAULT_TILE = (32, 256, 4, 4)
DEFAULT_GEMV_TILE = (8, 512, 4, 3)
Tile = tuple[int, int, int, int]


@functools.cache
def tile_tables() -> tuple[dict[str, Tile], dict[str, Tile]]:
    """(TILES, GEMV_TILES): the tile table file read on first use (``BRIGADE_CUDA_GEMM_TILES`` or the shipped
    ``gemm_tiles.json``); missing file: both empty."""
    path = Path(envs.BRIGADE_CUDA_GEMM_TILES or Path(__file__).with_name("gemm_tiles.json"))
    tables = json.loads(path.read_text()) if path.exists() else {}
    return ({k: tuple(v) for k, v in tables.get("tiles", {}).items()},
            {k: tuple(v) for k, v in tables.get("gemv_tiles", {}).items()})


def __getattr__(name: str) -> dict[str, Tile]:
    """``TILES`` and ``GEMV_TILES`` as module attributes, read lazily (``tile_tables``)."""
    if name == "TILES":
        return tile_tables()[0]
    if name == "GEMV_TILES":
        return tile_tables()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tile(n: int, k: int, fp8: bool = False) -> tuple[int, int, int, int]:
    """The tensor-core tile for weight [n, k]: ``"NxK/fp8"`` first for an FP8 weight, then ``"NxK"``, else the
    default."""
    tiles = tile_tables()[0]
    if fp8 and f"{n}x{k}/fp8" in tiles:
        return tiles[f"{n}x{k}/fp8"]
    return tiles.get(f"{n}x{k}", DEFAULT_TILE)


def check_skinny(x: torch.Tensor, weight: torch.Tensor, *, k_factor: int = 1,
                 weight_scale: torch.Tensor | None = None) -> str | None:
    """Why the skinny kernels cannot take ``x @ weight.T`` (one line), or None when they can.

    ``k_factor`` is 2 for the SiLU-and-mul input (``x`` holds gate and up halves of ``weight``'s K each). With
    ``weight_scale`` the weight is FP8 (``float8_e4m3fn`` codes, ``weight_scale`` [N] fp32 contiguous, one per
    output channel) and x may be fp16, bf16 or fp32; without it, x and the weight share one fp16/bf16 dtype.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != k_factor * weight.shape[1]:
        return (f"needs x [M, {k_factor if k_factor > 1 else ''}K] and weight [N, K], got {tuple(x.shape)} and "
                f"{tuple(weight.shape)}")
    if weight_scale is not None:
        if x.shape[0] > MAX_ROWS or weight.dtype != torch.float8_e4m3fn or x.dtype not in FP8_X_DTYPES:
            return f"takes at most {MAX_ROWS} fp16/bf16/fp32 rows and a float8_e4m3fn weight"
        if (weight_scale.dtype != torch.float32 or tuple(weight_scale.shape) != (weight.shape[0],)
                or not weight_scale.is_contiguous()):
            return f"needs a contiguous fp32 weight scale of shape [{weight.shape[0]}]"
    elif x.shape[0] > MAX_ROWS or x.dtype != weight.dtype or x.dtype not in (torch.float16, torch.bfloat16):
        return f"takes at most {MAX_ROWS} fp16/bf16 rows of the weight's dtype"
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        return "needs contiguous last dimensions"
    return None


def check_residual(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why ``residual`` cannot be added in the epilogue of ``x @ weight.T`` (one line), or None when it can: it
    must be [rows of x, N] in x's dtype with a contiguous last dimension."""
    if (residual.dim() != 2 or tuple(residual.shape) != (x.shape[0], weight.shape[0]) or residual.dtype != x.dtype
            or residual.stride(-1) != 1):
        return f"needs a contiguous [{x.shape[0]}, {weight.shape[0]}] residual in x's dtype"
    return None


def _gemv_tile(n: int, k: int, variant: str, fp8: bool = False) -> tuple[int, int, int, int]:
    """The one-row tile for weight [n, k]: ``"NxK/variant"``, else ``"NxK"``, else the default. An FP8 weight
    first looks for its own entries, ``"NxK/fp8_variant"`` then ``"NxK/fp8"``, and else takes the bf16 tile."""
    shape = f"{n}x{k}"
    gemv_tiles = tile_tables()[1]
    keys = [f"{shape}/fp8_{variant}", f"{shape}/fp8"] if fp8 and variant else [f"{shape}/fp8"] if fp8 else []
    keys += [f"{shape}/{variant}", shape] if variant else [shape]
    return next((gemv_tiles[key] for key in keys if key in gemv_tiles), DEFAULT_GEMV_TILE)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, silu_mul: bool = False,
         rms_norm_eps: float | None = None, residual: torch.Tensor | None = None,
         weight_scale: torch.Tensor | None = None, tile: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for one row; with ``silu_mul`` the input is ``silu_and_mul(x)``, with
    ``rms_norm_eps`` it is ``x / sqrt(mean(x**2) + eps)`` (RMSNorm without its weight, which the caller folded
    into ``weight``), and ``residual`` is added to the output.

    Args:
        x: [1, K] fp16/bf16 (with ``silu_mul``: [1, 2K], gate then up), last dimension contiguous.
        weight: [N, K], same dtype, last dimension contiguous.
        bias: optional [N].
        rms_norm_eps: normalize the input (not with ``silu_mul``); each program sums the squares of the row
            while it streams it, and scales its fp32 outputs by the reciprocal RMS before the bias.
        residual: optional [1, N] in x's dtype; the product is rounded to x's dtype, then added.
        weight_scale: optional [N] fp32: ``weight`` holds ``float8_e4m3fn`` codes, read as one byte each and
            widened in registers (x stays in its fp16/bf16/fp32 dtype: W8A16), and each output is scaled by its
            channel's scale before the norm, bias and residual.
        tile: (block_n, block_k, num_warps, num_stages); default from ``GEMV_TILES`` by shape.

    Returns: a new [1, N] tensor in x's dtype (fp32 accumulation; with ``silu_mul`` the activation is
    rounded to x's dtype first, exactly as ``silu_and_mul`` stores it).

    Raises:
        ValueError: on more than one row, mismatched shapes or dtypes, a non-contiguous last dimension, or
            ``silu_mul`` with ``rms_norm_eps``.
    """
    reason = check_skinny(x, weight, k_factor=2 if silu_mul else 1, weight_scale=weight_scale)
    if reason is None and x.shape[0] != 1:
        reason = "takes exactly one row"
    if reason is None and silu_mul and rms_norm_eps is not None:
        reason = "normalizes a plain input only, not a SiLU-and-mul one"
    if reason is None and residual is not None:
        reason = check_residual(residual, x, weight)
    if reason is not None:
        raise ValueError(f"gemv {reason}")
    n, k = weight.shape
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    block_n, block_k, num_warps, num_stages = tile or _gemv_tile(n, k, "silu_mul" if silu_mul else "",
                                                                 fp8=weight_scale is not None)
    fp8 = {} if weight_scale is None else {"s_ptr": weight_scale, "W_SCALE": True}  # bf16 compiles as before
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else y, residual if residual is not None else y, y, n, k,
        weight.stride(0), float(rms_norm_eps or 0.0),
        HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0, EVEN_N=n % block_n == 0, SILU_MUL=silu_mul,
        RMS_NORM=rms_norm_eps is not None, HAS_RESIDUAL=residual is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages, **fp8, **pdl_launch())
    return y


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  residual: torch.Tensor | None = None, weight_scale: torch.Tensor | None = None,
                  tile: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``x @ weight.T + bias (+ residual)`` for at most ``MAX_ROWS`` rows.

    Args:
        x: [M, K] fp16/bf16, M <= 16, last dimension contiguous.
        weight: [N, K], same dtype, last dimension contiguous.
        bias: optional [N].
        residual: optional [M, N] in x's dtype, last dimension contiguous; the product is rounded to x's
            dtype, then added.
        weight_scale: optional [N] fp32: ``weight`` holds ``float8_e4m3fn`` codes, widened to x's dtype in
            registers before the tensor-core product (W8A16; fp32 x multiplies in IEEE fp32, no TF32), the fp32 result
            scaled per output channel before bias and residual.
        tile: (block_n, block_k, num_warps, num_stages); default from ``TILES`` by shape.

    Returns: a new [M, N] tensor in x's dtype (fp32 accumulation).

    Raises:
        ValueError: on more than 16 rows, mismatched shapes or dtypes, a bad ``weight_scale``, or a
            non-contiguous last dimension.
    """
    reason = check_skinny(x, weight, weight_scale=weight_scale)
    if reason is None and residual is not None:
        reason = check_residual(residual, x, weight)
    if reason is not None:
        raise ValueError(f"skinny_linear {reason}")
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    block_n, block_k, num_warps, num_stages = tile or _tile(n, k, fp8=weight_scale is not None)
    r = residual if residual is not None else y
    fp8 = {} if weight_scale is None else {"s_ptr": weight_scale, "W_SCALE": True}  # bf16 compiles as before
    _skinny_gemm_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else y, r, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        r.stride(0), HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, EVEN_K=k % block_k == 0,
        BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages, **fp8,
        **pdl_launch())
    return y
