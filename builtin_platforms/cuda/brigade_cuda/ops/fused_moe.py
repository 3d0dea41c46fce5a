"""Fused mixture-of-experts in Triton: the experts of a layer in three kernels, whatever the batch.

The mechanism is vLLM's ``fused_moe`` (``moe_align_block_size`` then ``fused_moe_kernel``):

1. ``moe_align_block_size`` sorts the step's ``T * top_k`` (token, expert) assignments by expert and pads each
   expert's run to a multiple of ``BLOCK_M``, so that every ``BLOCK_M`` rows of the sorted list belong to one
   expert. One program does it (a histogram with atomics, the padded offsets by a cumulative sum, the expert of
   each block, then each assignment's slot by an atomic cursor per expert), so a layer pays one launch for it.
   Padding slots hold ``T * top_k``, which the GEMMs mask.
2. One grouped GEMM for gate and up: each program takes one block of ``BLOCK_M`` sorted assignments (one expert)
   and ``BLOCK_N`` columns of the intermediate dimension, gathers the tokens' rows of ``x``, multiplies them by
   that expert's gate and up rows (two tensor-core accumulators), and writes ``silu(gate) * up`` for each
   assignment: the activation never goes to memory as ``[gate | up]``.
3. One grouped GEMM for down, reading those rows, multiplying by the expert's down projection and by each
   assignment's router weight in the epilogue; then the sum over each token's ``top_k`` rows.

Only blocks that hold assignments run (the others return at once, reading the padded count from device memory),
so every active expert's weights are read once per ``BLOCK_M`` of its tokens: at decode sizes (a few tokens per
expert) once per step, which is the decode path; nothing depends on the host, so CUDA graphs capture it.

FP8 experts (``--quantization fp8``: ``float8_e4m3fn`` weights with one fp32 scale per expert and output channel)
run the same kernels as W8A16 behind the ``FP8_W`` constexpr: each FP8 weight tile is loaded (half the bytes of
bf16), converted to the activations' dtype in registers, multiplied on the same tensor-core path, and the
accumulators are multiplied by their columns' scales in the epilogue (a scale per output channel factors out of
the dot product). With ``FP8_W`` off the scale pointer is None and the code under the switch is not emitted, so
the bf16/fp16/fp32 kernels are the unquantized ones instruction for instruction.

gpt-oss's experts take two more switches, constexpr too, so that the SiLU kernels without biases compile as
before: ``ACTIVATION`` 1 is its clamped SwiGLU (``moe_activation``: ``gate`` clamped above at ``limit``, ``up``
to ``[-limit, limit]``, ``gate * sigmoid(alpha * gate) * (up + 1)``) in place of SiLU, and ``HAS_BIAS`` adds each
expert's gate/up bias to the accumulators before the activation and its down bias before the router weight.

Tiles (``BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages``) come per shape and token count from
``moe_tiles.json`` (written by ``benchmarks/kernels/bench_fused_moe.py --tune --write-tiles`` on the GPU) and
otherwise from ``default_tile``, which sizes ``BLOCK_M`` for the mean tokens per expert.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from brigade.model_executor.layers.moe_activation import SILU, MoEActivation
from brigade_cuda.ops.activation import silu_mul

ALIGN_CHUNK = 1024  # assignments per pass of the align program
ALIGN_BLOCK_CHUNK = 32  # expert_ids entries per pass


class MoETile(NamedTuple):
    """One launch configuration of the two grouped GEMMs."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


@triton.jit(do_not_specialize=["num_assignments", "max_padded", "max_blocks"])
def _moe_align_kernel(topk_ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, cursor_ptr,
                      num_assignments, num_experts, max_padded, max_blocks,
                      BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, CHUNK: tl.constexpr, BLOCK_CHUNK: tl.constexpr):
    offs = tl.arange(0, CHUNK)
    e_offs = tl.arange(0, E_POW2)
    e_ok = e_offs < num_experts
    ones = tl.full((CHUNK,), 1, tl.int32)
    # 0. every slot is padding until filled; every expert's count is zero
    for start in range(0, max_padded, CHUNK):
        idx = start + offs
        tl.store(sorted_ids_ptr + idx, tl.zeros((CHUNK,), tl.int32) + num_assignments, mask=idx < max_padded)
    tl.store(cursor_ptr + e_offs, tl.zeros((E_POW2,), tl.int32), mask=e_ok)
    tl.debug_barrier()
    # 1. assignments per expert
    for start in range(0, num_assignments, CHUNK):
        idx = start + offs
        ok = idx < num_assignments
        ids = tl.load(topk_ids_ptr + idx, mask=ok, other=0).to(tl.int32)
        tl.atomic_add(cursor_ptr + ids, ones, mask=ok)
    tl.debug_barrier()
    # 2. each expert's run padded to BLOCK_M: [starts, ends) in the sorted list; the expert of every block
    counts = tl.load(cursor_ptr + e_offs, mask=e_ok, other=0, volatile=True)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    tl.store(num_post_ptr, tl.sum(padded, 0))
    b_offs = tl.arange(0, BLOCK_CHUNK)
    for start in range(0, max_blocks, BLOCK_CHUNK):
        blocks = start + b_offs
        before = (ends[None, :] <= (blocks * BLOCK_M)[:, None]) & e_ok[None, :]  # experts wholly before the block
        expert = tl.minimum(tl.sum(before.to(tl.int32), 1), num_experts - 1)  # past the end: never run
        tl.store(expert_ids_ptr + blocks, expert, mask=blocks < max_blocks)
    tl.debug_barrier()  # every thread has read the counts before they become cursors
    tl.store(cursor_ptr + e_offs, starts, mask=e_ok)
    tl.debug_barrier()
    # 3. each assignment to the next free slot of its expert's run
    for start in range(0, num_assignments, CHUNK):
        idx = start + offs
        ok = idx < num_assignments
        ids = tl.load(topk_ids_ptr + idx, mask=ok, other=0).to(tl.int32)
        slot = tl.atomic_add(cursor_ptr + ids, ones, mask=ok)
        tl.store(sorted_ids_ptr + slot, idx, mask=ok)


def padded_size(num_assignments: int, num_experts: int, block_m: int) -> int:
    """Most rows the sorted list can need: each expert that has assignments pads at most ``block_m - 1``;
    rounded up to ``block_m``."""
    size = num_assignments + min(num_experts, num_assignments) * (block_m - 1)
    return triton.cdiv(size, block_m) * block_m


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the assignments by expert, each expert's run padded to ``block_m`` rows (vLLM's
    ``moe_align_block_size``).

    Args:
        topk_ids: [T, k] int32/int64 on CUDA, each in [0, num_experts); assignment ``a = t * k + j``.
        num_experts: E. block_m: rows per GEMM block.

    Returns:
        sorted_ids [padded_size] int32: assignments grouped by expert, ``T * k`` in padding slots;
        expert_ids [padded_size / block_m] int32: the expert of each block;
        num_post_padded [1] int32: rows in use (device memory; blocks at or past it hold nothing).
        Within an expert the order is not fixed (atomics); each row is computed the same wherever it lands.
    """
    num_assignments = topk_ids.numel()
    max_padded = padded_size(num_assignments, num_experts, block_m)
    device = topk_ids.device
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=device)
    expert_ids = torch.empty(max_padded // block_m, dtype=torch.int32, device=device)
    num_post = torch.empty(1, dtype=torch.int32, device=device)
    cursor = torch.empty(num_experts, dtype=torch.int32, device=device)
    _moe_align_kernel[(1,)](topk_ids.reshape(-1), sorted_ids, expert_ids, num_post, cursor, num_assignments,
                            num_experts, max_padded, max_padded // block_m, BLOCK_M=block_m,
                            E_POW2=triton.next_power_of_2(num_experts), CHUNK=ALIGN_CHUNK,
                            BLOCK_CHUNK=ALIGN_BLOCK_CHUNK, num_warps=8)
    return sorted_ids, expert_ids, num_post


@triton.jit
def _block_of(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program ``pid``, GROUP_M row blocks at a time so that neighbours share weight tiles."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    if IEEE:  # fp32 models: no TF32 rounding of the inputs
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _swiglu_oai_mul(gate, up, alpha, limit, DTYPE: tl.constexpr):
    # gpt-oss's clamped SwiGLU from fp32 gate and up (already rounded to DTYPE), the product rounded to DTYPE
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    glu = gate / (1.0 + tl.exp(-gate * alpha))
    return ((up + 1.0) * glu).to(DTYPE)


@triton.jit(do_not_specialize=["num_assignments", "num_pid_m"])
def _moe_gate_up_kernel(x_ptr, w_ptr, w_scale_ptr, b_ptr, out_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
                        num_assignments, num_pid_m, N, K, stride_xm, stride_we, stride_wn, stride_om, alpha, limit,
                        TOP_K: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, FP8_W: tl.constexpr,
                        HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """out[a, n] = silu(x[a // TOP_K] . w[e, n]) * (x[a // TOP_K] . w[e, N + n]) for the block's assignments a of
    expert e; w is [E, 2N, K] (gate rows, then up rows), out [T * TOP_K, N]. With ``FP8_W``, w is FP8 and each
    dot is multiplied by its row's scale, ``w_scale`` [E, 2N] contiguous fp32 (None otherwise). With ``HAS_BIAS``
    ``b`` [E, 2N] contiguous is added to the dots (None otherwise); ``ACTIVATION`` 1: the clamped SwiGLU
    (``alpha``, ``limit``) instead of SiLU."""
    pid_m, pid_n = _block_of(tl.program_id(0), num_pid_m, tl.cdiv(N, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):
        return
    assign = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM]
    m_ok = assign < num_assignments
    tokens = (assign // TOP_K).to(tl.int64)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tokens[:, None] * stride_xm + offs_k[None, :]  # [BM, BK]
    wg_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # [BK, BN]
    wu_ptrs = wg_ptrs + N * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            wg = tl.load(wg_ptrs, mask=n_ok[None, :], other=0.0)
            wu = tl.load(wu_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = offs_k < K - k * BLOCK_K
            x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            wg = tl.load(wg_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            wu = tl.load(wu_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if FP8_W:  # W8A16: the FP8 tiles become the activations' dtype in registers (exactly: e4m3 fits in it)
            wg = wg.to(x.dtype)
            wu = wu.to(x.dtype)
        acc_g = _dot(x, wg, acc_g, IEEE)
        acc_u = _dot(x, wu, acc_u, IEEE)
        x_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K
        wu_ptrs += BLOCK_K
    if FP8_W:  # the per-channel scales of the expert's gate and up rows
        scale_ptrs = w_scale_ptr + expert * 2 * N + offs_n
        acc_g *= tl.load(scale_ptrs, mask=n_ok, other=0.0)[None, :]
        acc_u *= tl.load(scale_ptrs + N, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        bias_ptrs = b_ptr + expert * 2 * N + offs_n
        acc_g += tl.load(bias_ptrs, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(bias_ptrs + N, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    dtype = out_ptr.dtype.element_ty
    # gate and up rounded to the model dtype first, as the reference's GEMM output is
    if ACTIVATION == 1:
        act = _swiglu_oai_mul(acc_g.to(dtype).to(tl.float32), acc_u.to(dtype).to(tl.float32), alpha, limit, dtype)
    else:
        act = silu_mul(acc_g.to(dtype).to(tl.float32), acc_u.to(dtype).to(tl.float32), dtype)
    out_ptrs = out_ptr + assign[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, act, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["num_assignments", "num_pid_m"])
def _moe_down_kernel(a_ptr, w_ptr, w_scale_ptr, b_ptr, out_ptr, topk_weights_ptr, sorted_ids_ptr, expert_ids_ptr,
                     num_post_ptr, num_assignments, num_pid_m, N, K, stride_am, stride_we, stride_wn, stride_om,
                     EVEN_K: tl.constexpr, IEEE: tl.constexpr, FP8_W: tl.constexpr, HAS_BIAS: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """out[a, n] = topk_weights[a] * (a_rows[a] . w[e, n]) for the block's assignments a of expert e; w is
    [E, N, K], a_rows [T * top_k, K], out [T * top_k, N]. With ``FP8_W``, w is FP8 and ``w_scale`` [E, N]
    contiguous fp32 scales each output channel (None otherwise). With ``HAS_BIAS``, ``b`` [E, N] contiguous is
    added before the router weight (None otherwise)."""
    pid_m, pid_n = _block_of(tl.program_id(0), num_pid_m, tl.cdiv(N, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):
        return
    assign = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    m_ok = assign < num_assignments
    rows = assign.to(tl.int64)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=m_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = offs_k < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if FP8_W:
            w = w.to(a.dtype)
        acc = _dot(a, w, acc, IEEE)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if FP8_W:
        acc *= tl.load(w_scale_ptr + expert * N + offs_n, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + expert * N + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    acc *= tl.load(topk_weights_ptr + rows, mask=m_ok, other=0.0)[:, None]
    out_ptrs = out_ptr + rows[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _moe_sum_kernel(in_ptr, out_ptr, H, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    # out[t] = sum_j in[t, j] over the top-k rows of token t, in fp32, rounded once.
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = offs < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(in_ptr + (t * TOP_K + j) * H + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


MOE_SUM_BLOCK = 1024  # hidden columns per program of the top-k sum


def moe_sum(out: torch.Tensor, num_tokens: int, top_k: int) -> torch.Tensor:
    """``out.view(T, top_k, H).sum(dim=1)`` in one kernel (PyTorch's reduction launches a slower generic reduce):
    [T * top_k, H] contiguous -> a new [T, H] in out's dtype, fp32 accumulation."""
    hidden = out.shape[1]
    y = torch.empty(num_tokens, hidden, dtype=out.dtype, device=out.device)
    _moe_sum_kernel[(num_tokens, triton.cdiv(hidden, MOE_SUM_BLOCK))](out, y, hidden, TOP_K=top_k,
                                                                      BLOCK_H=MOE_SUM_BLOCK, num_warps=4)
    return y


def default_tile(num_tokens: int, top_k: int, num_experts: int, inter: int = 0) -> MoETile:
    """The tile for a shape the table lacks. ``BLOCK_M`` covers twice the mean tokens per expert (routes are
    uneven), so that up to that many tokens an expert's weights are read once: a decode step runs blocks of 16
    rows, one per active expert; a long prefill 128-row blocks, where the GEMMs are compute-bound. Narrow experts
    (``inter`` up to 1024) decode with 32 columns per program, so that the few active experts still give the SMs
    enough programs. The gate/up kernel holds two accumulators, hence at most 64 columns beside 128 rows."""
    busiest = 2 * num_tokens * top_k / num_experts
    if busiest <= 16:
        return MoETile(16, 32 if 0 < inter <= 1024 else 64, 128, 1, 4, 4)
    if busiest <= 32:
        return MoETile(32, 64, 128, 8, 4, 4)
    if busiest <= 64:
        return MoETile(64, 128, 64, 8, 4, 4)
    return MoETile(128, 64, 64, 8, 8, 4)


def tile_key(num_experts: int, hidden: int, inter: int, top_k: int) -> str:
    """The table's key of an expert shape: ``"E=8,H=4096,I=14336,k=2"``."""
    return f"E={num_experts},H={hidden},I={inter},k={top_k}"


@functools.cache
def tile_table(path: str | None = None) -> dict[str, dict[int, MoETile]]:
    """``moe_tiles.json`` beside this module (or ``path``): shape key -> {token count: tile}; empty if absent."""
    file = Path(path) if path else Path(__file__).with_name("moe_tiles.json")
    raw = json.loads(file.read_text()).get("tiles", {}) if file.exists() else {}
    return {shape: {int(t): MoETile(*tile) for t, tile in by_tokens.items()} for shape, by_tokens in raw.items()}


def pick_tile(num_tokens: int, num_experts: int, hidden: int, inter: int, top_k: int) -> MoETile:
    """The table's tile for the smallest listed token count at or above ``num_tokens`` (the largest one beyond
    them), else ``default_tile``."""
    by_tokens = tile_table().get(tile_key(num_experts, hidden, inter, top_k))
    if not by_tokens:
        return default_tile(num_tokens, top_k, num_experts, inter)
    fitting = [t for t in by_tokens if t >= num_tokens]
    return by_tokens[min(fitting) if fitting else max(by_tokens)]


# What one program's pipelined operand tiles may take of a streaming multiprocessor's shared memory (the H100/H200
# limit is 227 KiB; the rest goes to the epilogue and Triton's own scratch).
SHARED_MEMORY_BUDGET = 200 * 1024


def fit_shared_memory(tile: MoETile, element_size: int) -> MoETile:
    """``tile`` with fewer pipeline stages where its operand tiles would overflow ``SHARED_MEMORY_BUDGET``.

    The gate/up program keeps, per stage, an activation tile [BLOCK_M, BLOCK_K] and two weight tiles
    [BLOCK_K, BLOCK_N] (gate and up); the down program fewer. The table is tuned in bf16: fp32 operands take
    twice the bytes, so an fp32 model runs the same tile with fewer stages rather than fail to launch.
    """
    per_stage = (tile.block_m * tile.block_k + 2 * tile.block_k * tile.block_n) * element_size
    stages = tile.num_stages
    while stages > 1 and stages * per_stage > SHARED_MEMORY_BUDGET:
        stages -= 1
    return tile if stages == tile.num_stages else tile._replace(num_stages=stages)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, *, w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
              w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None,
              activation: MoEActivation = SILU, tile: MoETile | None = None) -> torch.Tensor:
    """``sum_j topk_weights[t, j] * down_e(act(gate_e(x_t)) * up_e(x_t))``, ``e = topk_ids[t, j]``.

    Args:
        x: [T, H] fp16/bf16/fp32 on CUDA, last dimension contiguous.
        w13: [E, 2I, H] (gate rows, then up rows), x's dtype, contiguous. w2: [E, H, I], contiguous. Or both
            ``float8_e4m3fn`` (compute capability 8.9 and up) with ``w13_scale`` [E, 2I] and ``w2_scale`` [E, H]
            contiguous fp32, one scale per expert and output channel: the W8A16 kernels.
        topk_weights: [T, k] float32. topk_ids: [T, k] int32/int64.
        w13_bias: [E, 2I], w2_bias: [E, H], contiguous, in x's dtype, both or neither (gpt-oss's expert biases).
        activation: ``act``: SiLU, or gpt-oss's clamped SwiGLU (``moe_activation.MoEActivation``).
        tile: a launch configuration (benchmarks); default: ``pick_tile``.

    Returns:
        [T, H] in x's dtype. The activation between the GEMMs and each expert's weighted output are stored in
        x's dtype; the sum over the top-k accumulates in fp32 and rounds once.
    """
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = w13.shape
    inter, top_k = two_inter // 2, topk_ids.shape[1]
    if num_tokens == 0:
        return torch.empty_like(x)
    tile = fit_shared_memory(tile or pick_tile(num_tokens, num_experts, hidden, inter, top_k), x.element_size())
    sorted_ids, expert_ids, num_post = moe_align_block_size(topk_ids, num_experts, tile.block_m)
    num_assignments = num_tokens * top_k
    num_pid_m = expert_ids.numel()
    ieee = x.dtype == torch.float32
    fp8 = w13_scale is not None
    bias = dict(HAS_BIAS=w13_bias is not None)
    launch = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, GROUP_M=tile.group_m,
                  num_warps=tile.num_warps, num_stages=tile.num_stages)
    act = torch.empty(num_assignments, inter, dtype=x.dtype, device=x.device)
    grid = (num_pid_m * triton.cdiv(inter, tile.block_n),)
    _moe_gate_up_kernel[grid](x, w13, w13_scale, w13_bias, act, sorted_ids, expert_ids, num_post, num_assignments,
                              num_pid_m, inter, hidden, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
                              float(activation.alpha), float(activation.limit), TOP_K=top_k,
                              EVEN_K=hidden % tile.block_k == 0, IEEE=ieee, FP8_W=fp8,
                              ACTIVATION=int(activation.name == "swigluoai"), **bias, **launch)
    out = torch.empty(num_assignments, hidden, dtype=x.dtype, device=x.device)
    grid = (num_pid_m * triton.cdiv(hidden, tile.block_n),)
    _moe_down_kernel[grid](act, w2, w2_scale if fp8 else None, w2_bias, out, topk_weights.reshape(-1).float(),
                           sorted_ids, expert_ids, num_post, num_assignments, num_pid_m, hidden, inter, act.stride(0),
                           w2.stride(0), w2.stride(1), out.stride(0), EVEN_K=inter % tile.block_k == 0, IEEE=ieee,
                           FP8_W=fp8, **bias, **launch)
    return out if top_k == 1 else moe_sum(out, num_tokens, top_k)  # fp32 accumulation


def check_fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor | None = None,
                    w2_scale: torch.Tensor | None = None) -> str | None:
    """Why ``fused_moe`` cannot take these tensors (one line), or None when it can."""
    if x.dim() != 2 or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return "needs x [T, H] in fp16/bf16/fp32"
    if w13_scale is None and x.dtype != w13.dtype:
        return "needs the experts in x's dtype, or FP8 with their scales"
    if w13_scale is not None and (w13.dtype != torch.float8_e4m3fn or w2.dtype != torch.float8_e4m3fn
                                  or w2_scale is None):
        return "needs both expert weights in float8_e4m3fn with both scales"
    if x.stride(-1) != 1 or not (w13.is_contiguous() and w2.is_contiguous()):
        return "needs a contiguous last dimension of x and contiguous expert weights"
    return None


@functools.cache
def loads_fp8(device_index: int) -> bool:
    """Whether Triton can load ``float8_e4m3fn`` on this CUDA device (compute capability 8.9 and up)."""
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


def fused_moe_cuda(layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """``FusedMoE`` on CUDA: same contract as ``FusedMoE.forward_native``; reads ``layer.w13_weight``,
    ``layer.w2_weight`` and, for FP8 experts, ``layer.w13_weight_scale`` and ``layer.w2_weight_scale`` (the W8A16
    kernels). A layout the kernel does not take is made contiguous first (never the reference, whose per-expert
    count would synchronize with the host inside a CUDA graph); experts in another float dtype than x, and FP8
    experts on a GPU older than compute capability 8.9, take the reference path."""
    w13, w2 = layer.w13_weight, layer.w2_weight
    s13, s2 = layer.w13_weight_scale, layer.w2_weight_scale
    b13, b2 = layer.w13_bias, layer.w2_bias
    takes = loads_fp8(x.device.index or 0) if s13 is not None else x.dtype == w13.dtype
    if not takes:
        return layer.forward_native(x, topk_weights, topk_ids)
    if check_fused_moe(x, w13, w2, s13, s2) is not None:
        x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
        s13, s2 = (None, None) if s13 is None else (s13.contiguous(), s2.contiguous())
    if b13 is not None and not (b13.is_contiguous() and b2.is_contiguous()):
        b13, b2 = b13.contiguous(), b2.contiguous()
    return fused_moe(x, w13, w2, topk_weights, topk_ids, w13_scale=s13, w2_scale=s2, w13_bias=b13, w2_bias=b2,
                     activation=layer.activation)
