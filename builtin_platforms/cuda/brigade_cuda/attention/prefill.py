"""Varlen paged prefill attention in Triton, flash-attention style (Dao et al.,
"FlashAttention-2", 2023).

One program per ``(prefill request, query head, BLOCK_M query rows)`` streams the request's keys and
values in BLOCK_N tiles with an online softmax. All keys, including those of this step's own tokens,
are read from the paged cache through the block table (the KV write runs first), so prefix-cached and
chunked prefills need no separate path: query row i of a request sits at absolute position
``seq_len - query_len + i`` and sees keys ``0..that position``.

The attention variants (``variants.py``): under a sliding window a tile's keys start at the window of its first
row and every tile is masked; a soft cap bends each score before the mask; sinks seed the online softmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brigade_cuda.attention.decode import LOG2E
from brigade_cuda.attention.fp8_kv import kernel_scales
from brigade_cuda.attention.variants import soft_cap, softmax_start, variant_constexprs


@triton.jit
def _attend_tile(acc, m_i, l_i, q, q_pos, n0, kv_end, bt_row, k_cache_ptr, v_cache_ptr, head_off, dims, dim_mask,
                 scale_log2, stride_cache_block, stride_cache_tok,
                 BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr = False, SLIDING_WINDOW: tl.constexpr = 0,
                 SOFT_CAP: tl.constexpr = 0.0):
    """One online-softmax step over keys ``n0 .. n0 + BLOCK_N - 1``; MASKED adds the causal/length mask. KV_FP8:
    a float8 e4m3 cache, upcast to the query's dtype (the caller folds the k scale into ``scale_log2`` and
    multiplies the output by the v scale; fp8_kv.py). SLIDING_WINDOW (with MASKED) hides keys before each row's
    window; a row may then see no key of the tile, so the max is taken as 0 where it is still -inf (no NaN).
    Keys before the first row's window are not loaded at all. SOFT_CAP (log2 units) caps the scores
    (variants.py)."""
    pos = n0 + tl.arange(0, BLOCK_N)
    pos_mask = pos < kv_end
    if SLIDING_WINDOW:  # keys before the first row's window are never read (their blocks may be freed)
        pos_mask = pos_mask & (pos > tl.min(q_pos, 0) - SLIDING_WINDOW)
    block = tl.load(bt_row + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
    row = block * stride_cache_block + (pos % BLOCK_SIZE) * stride_cache_tok + head_off  # [N]
    kv_mask = pos_mask[:, None] & dim_mask[None, :]
    k = tl.load(k_cache_ptr + row[:, None] + dims[None, :], mask=kv_mask, other=0.0)  # [N, D]
    if KV_FP8:
        k = k.to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [M, N], log2 units
    if SOFT_CAP > 0.0:
        s = soft_cap(s, SOFT_CAP)
    if MASKED:
        visible = (pos[None, :] <= q_pos[:, None]) & pos_mask[None, :]
        if SLIDING_WINDOW:
            visible = visible & (pos[None, :] > q_pos[:, None] - SLIDING_WINDOW)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if SLIDING_WINDOW:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
    else:
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_cache_ptr + row[:, None] + dims[None, :], mask=kv_mask, other=0.0)  # [N, D]
    if KV_FP8:
        v = v.to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attend_causal(q, q_pos, first_pos, kv_end, bt_row, k_cache_ptr, v_cache_ptr, head_off, dims, dim_mask,
                   scale_log2, stride_cache_block, stride_cache_tok, m_i, l_i,
                   BLOCK_M: tl.constexpr, HEAD_P2: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr = False, SLIDING_WINDOW: tl.constexpr = 0,
                   SOFT_CAP: tl.constexpr = 0.0):
    """Causal attention of a tile of query rows ``q`` [M, D] (absolute positions ``q_pos``, the smallest
    ``first_pos``) over keys ``0 .. kv_end - 1``, from the online softmax's start ``m_i``/``l_i`` [M]
    (``variants.softmax_start``); returns the normalized output [M, D] in float32.

    Whole key tiles before ``first_pos`` are visible to every row: no mask. Keys from ``kv_end`` on are visible
    to none. Tiles in between get the causal mask; key 0 is visible to every row (masked rows included, whose
    positions only lie further on), so each row's running max is finite after the first tile. Under a sliding
    window the keys start at the tile holding the first row's first key and every tile is masked."""
    acc = tl.zeros([BLOCK_M, HEAD_P2], tl.float32)
    if SLIDING_WINDOW:
        for n0 in range(tl.maximum(first_pos - SLIDING_WINDOW + 1, 0) // BLOCK_N * BLOCK_N, kv_end, BLOCK_N):
            acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, q_pos, n0, kv_end, bt_row, k_cache_ptr, v_cache_ptr,
                                         head_off, dims, dim_mask, scale_log2, stride_cache_block,
                                         stride_cache_tok, BLOCK_SIZE, BLOCK_N, True, DOT_PRECISION, KV_FP8,
                                         SLIDING_WINDOW, SOFT_CAP)
        return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    full_end = first_pos // BLOCK_N * BLOCK_N
    for n0 in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, q_pos, n0, kv_end, bt_row, k_cache_ptr, v_cache_ptr,
                                     head_off, dims, dim_mask, scale_log2, stride_cache_block, stride_cache_tok,
                                     BLOCK_SIZE, BLOCK_N, False, DOT_PRECISION, KV_FP8, 0, SOFT_CAP)
    for n0 in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, q_pos, n0, kv_end, bt_row, k_cache_ptr, v_cache_ptr,
                                     head_off, dims, dim_mask, scale_log2, stride_cache_block, stride_cache_tok,
                                     BLOCK_SIZE, BLOCK_N, True, DOT_PRECISION, KV_FP8, 0, SOFT_CAP)
    return acc / l_i[:, None]


# The first request's index and the block table's width change from step to step: not specialized, so a new
# value never compiles a variant mid-serving (see decode.py).
@triton.jit(do_not_specialize=["first_req", "stride_bt_r"])
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    scale_log2, first_req,
    stride_q_t, stride_q_h, stride_out_t, stride_out_h,
    stride_cache_block, stride_cache_tok, stride_cache_h, stride_bt_r, v_scale, sinks_ptr,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr, HEAD_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr = False,
    SLIDING_WINDOW: tl.constexpr = 0, SOFT_CAP: tl.constexpr = 0.0,
):
    req = first_req + tl.program_id(0)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if m_block * BLOCK_M >= q_len:  # the grid is sized for the longest query of the step
        return
    seq_len = tl.load(seq_lens_ptr + req)
    context_len = seq_len - q_len
    kv_head = head // GROUP

    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < q_len
    dims = tl.arange(0, HEAD_P2)
    dim_mask = dims < HEAD_SIZE
    tok = (q_start + rows).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * stride_q_t + head * stride_q_h + dims[None, :],
                mask=row_mask[:, None] & dim_mask[None, :], other=0.0)  # [M, D]
    q_pos = context_len + rows  # absolute position of each query row

    bt_row = block_table_ptr + req.to(tl.int64) * stride_bt_r
    kv_end = tl.minimum(seq_len, context_len + (m_block + 1) * BLOCK_M)  # keys past the block's last row
    heads = head + tl.zeros([BLOCK_M], tl.int32)  # one query head per program
    m_i, l_i = softmax_start(sinks_ptr, heads, heads >= 0, BLOCK_M)
    o = _attend_causal(q, q_pos, context_len + m_block * BLOCK_M, kv_end, bt_row, k_cache_ptr, v_cache_ptr,
                       kv_head * stride_cache_h, dims, dim_mask, scale_log2, stride_cache_block, stride_cache_tok,
                       m_i, l_i, BLOCK_M, HEAD_P2, BLOCK_SIZE, BLOCK_N, DOT_PRECISION, KV_FP8, SLIDING_WINDOW,
                       SOFT_CAP)
    if KV_FP8:  # a float8 cache: the v scale (the k scale is in scale_log2)
        o = o * v_scale
    tl.store(out_ptr + tok[:, None] * stride_out_t + head * stride_out_h + dims[None, :],
             o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dim_mask[None, :])


def prefill_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                      seq_lens: torch.Tensor, query_start_loc: torch.Tensor, out: torch.Tensor, *,
                      first_req: int, num_prefills: int, max_query_len: int, scale: float,
                      tile: tuple[int, int, int, int] | None = None, k_scale: float = 1.0,
                      v_scale: float = 1.0, sliding_window: int | None = None,
                      logits_soft_cap: float | None = None, sinks: torch.Tensor | None = None) -> None:
    """Causal paged attention for requests ``first_req .. first_req + num_prefills - 1``.

    Args:
        query: [num_tokens, num_heads, head_size]; request r's rows are
            ``query_start_loc[r] .. query_start_loc[r + 1] - 1``.
        kv_cache: [2, num_blocks, block_size, num_kv_heads, head_size], already holding this step's K/V; query's
            dtype, or float8 e4m3 read as ``stored * k_scale`` / ``stored * v_scale`` (``fp8_kv.py``).
        block_table: [num_reqs, max_blocks] int32; seq_lens: [num_reqs] int32;
        query_start_loc: [num_reqs + 1] int32 (device).
        out: [num_tokens, num_heads, head_size], written at these requests' rows.
        max_query_len: host upper bound on these requests' query lengths (sizes the grid).
        scale: softmax scale.
        tile: optional ``(block_m, block_n, num_warps, num_stages)`` overriding the defaults (benchmarks).
        sliding_window, logits_soft_cap, sinks: the layer's variants (``variants.py``; sinks [num_heads]).
    """
    if num_prefills == 0:
        return
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    num_heads = query.shape[1]
    head_p2 = triton.next_power_of_2(head_size)
    # Register/shared-memory budget: halve the tiles for fp32 or very wide heads.
    wide = head_p2 > 128 or query.dtype == torch.float32
    if tile is None:
        tile = (64, 32, 8, 2) if wide else (64, 64, 4, 2)
    block_m, block_n, num_warps, num_stages = tile
    precision = "ieee" if query.dtype == torch.float32 else "tf32"
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    grid = (num_prefills, num_heads, triton.cdiv(max_query_len, block_m))
    fp8, k_fold, v_mul, _, _ = kernel_scales(kv_cache, k_scale, v_scale)
    _prefill_kernel[grid](
        query, k_cache, v_cache, block_table, seq_lens, query_start_loc, out,
        scale * LOG2E * k_fold, first_req,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0), v_mul, sinks,
        BLOCK_SIZE=block_size, GROUP=num_heads // num_kv_heads, HEAD_SIZE=head_size, HEAD_P2=head_p2,
        BLOCK_M=block_m, BLOCK_N=block_n, DOT_PRECISION=precision, KV_FP8=fp8,
        **variant_constexprs(sliding_window, logits_soft_cap),
        num_warps=num_warps, num_stages=num_stages,
    )
