"""Varlen paged attention for a whole mixed prefill/decode step in one launch whose grid depends only on the
padded token and request counts (book ch. 6 for the algorithm, ch. 10 for CUDA graphs; Dao, "FlashAttention-2",
2023; the request lookup and GQA packing follow the idea of vLLM's Triton "unified attention" kernel).

One program per ``(global query block, kv head)``. Request ``r`` owns the global query blocks from
``query_start_loc[r] // BLOCK_Q + r`` on: these starts increase strictly with ``r`` and lie at least
``cdiv(query_len, BLOCK_Q)`` apart, so ``T // BLOCK_Q + num_reqs`` blocks cover every request of a step of ``T``
padded token rows, whatever the mix. A program finds its request by binary search over the starts, reading
``query_start_loc`` on the device, and leaves at once when its block lies past the request's query (the slack
the ``+ r`` leaves, and padding requests). Nothing the grid or the compiled variant depends on follows the
step, so a step captured in a CUDA graph replays correctly for any mix of decodes and prefills (in any order)
with the same padded token count ``T`` and request count.

GQA: the ``GROUP = num_heads // num_kv_heads`` query heads that share a KV head are packed into the rows of one
tile, ``BLOCK_Q`` query tokens by ``GROUP_P2`` (the next power of two) heads: row ``m`` is query token
``m // GROUP_P2`` of the block and head ``m % GROUP_P2`` of the group (masked past ``GROUP``). Every K/V tile is
read once per KV head for the whole group, and a decode (one query token) fills ``GROUP`` rows of the tile.

Within a program the keys stream in ``BLOCK_N`` tiles through the block table with an online softmax, as
``prefill.py`` (whose ``_attend_causal`` this reuses): query token ``i`` of a request sits at absolute position
``seq_len - query_len + i`` and sees keys ``0..that position``, all read from the paged cache (the KV write runs
first), so prefix-cached and chunked prefills and decodes take the same path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brigade_cuda.attention.decode import LOG2E
from brigade_cuda.attention.prefill import _attend_causal

DEFAULT_TILE_ROWS = 64  # tile rows (query tokens x packed heads) per program unless ``tile`` says otherwise


# The request count and the block table's width change from step to step outside the graphs (eager mixed
# steps): not specialized, so a new value never compiles a variant mid-serving (see decode.py).
@triton.jit(do_not_specialize=["num_reqs", "stride_bt_r"])
def _varlen_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    scale_log2, num_reqs,
    stride_q_t, stride_q_h, stride_out_t, stride_out_h,
    stride_cache_block, stride_cache_tok, stride_cache_h, stride_bt_r,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_P2: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_P2: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    # The last request whose first block is at or before this one; request 0 starts at block 0.
    lo: tl.int32 = 0
    hi = num_reqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid
        else:
            hi = mid
    req = lo
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    j = q_block - (q_start // BLOCK_Q + req)  # this program's block within the request's query
    seq_len = tl.load(seq_lens_ptr + req)
    # Past the request's query, or a padding request (seq_len 0): nothing to write.
    if (j * BLOCK_Q >= q_len) | (seq_len < q_len):
        return
    context_len = seq_len - q_len

    m = tl.arange(0, BLOCK_M)
    tok_local = j * BLOCK_Q + m // GROUP_P2  # [M] query token of each row, within the request
    in_group = m % GROUP_P2
    heads = kv_head * GROUP + in_group  # [M] query head of each row
    row_mask = (tok_local < q_len) & (in_group < GROUP)
    dims = tl.arange(0, HEAD_P2)
    dim_mask = dims < HEAD_SIZE
    tok = (q_start + tok_local).to(tl.int64)
    io_mask = row_mask[:, None] & dim_mask[None, :]
    q = tl.load(q_ptr + tok[:, None] * stride_q_t + heads[:, None] * stride_q_h + dims[None, :],
                mask=io_mask, other=0.0)  # [M, D]
    q_pos = context_len + tok_local  # absolute position of each row's query token

    bt_row = block_table_ptr + req.to(tl.int64) * stride_bt_r
    kv_end = tl.minimum(seq_len, context_len + (j + 1) * BLOCK_Q)  # keys past the block's last query token
    o = _attend_causal(q, q_pos, context_len + j * BLOCK_Q, kv_end, bt_row, k_cache_ptr, v_cache_ptr,
                       kv_head * stride_cache_h, dims, dim_mask, scale_log2, stride_cache_block, stride_cache_tok,
                       BLOCK_M, HEAD_P2, BLOCK_SIZE, BLOCK_N, DOT_PRECISION)
    tl.store(out_ptr + tok[:, None] * stride_out_t + heads[:, None] * stride_out_h + dims[None, :],
             o.to(out_ptr.dtype.element_ty), mask=io_mask)


def varlen_tile(dtype: torch.dtype, head_size: int, group: int,
                tile: tuple[int, int, int, int] | None = None) -> tuple[int, int, int, int, int]:
    """The launch shape for a layer: ``(BLOCK_Q, BLOCK_M, BLOCK_N, num_warps, num_stages)``.

    ``BLOCK_M = BLOCK_Q * next_power_of_2(group)`` tile rows, 64 by default (``BLOCK_Q = max(1, 64 // GROUP_P2)``;
    a group wider than 64 heads takes one token per tile). Keys stream in ``BLOCK_N = 64`` tiles with 4 warps,
    halved to 32 with 8 warps for fp32 or heads wider than 128 (registers/shared memory, as ``prefill.py``).
    ``tile = (block_m, block_n, num_warps, num_stages)`` overrides them (benchmarks); ``block_m`` is the wanted
    row count, rounded down to a multiple of ``GROUP_P2`` (at least one token).

    Raises:
        ValueError: ``group`` < 1, or a ``tile`` whose block_m/block_n is not a power of two of at least 16.
    """
    if group < 1:
        raise ValueError(f"GQA group must be at least 1, got {group}")
    group_p2 = triton.next_power_of_2(group)
    if tile is None:
        wide = triton.next_power_of_2(head_size) > 128 or dtype == torch.float32
        tile = (DEFAULT_TILE_ROWS, 32, 8, 2) if wide else (DEFAULT_TILE_ROWS, 64, 4, 2)
    block_m, block_n, num_warps, num_stages = tile
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value < 16 or value & (value - 1):
            raise ValueError(f"tile {name} must be a power of two of at least 16 (tl.dot), got {value}")
    block_q = max(1, block_m // group_p2)
    return block_q, block_q * group_p2, block_n, num_warps, num_stages


def varlen_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                     query_start_loc: torch.Tensor, out: torch.Tensor, *, num_reqs: int, scale: float,
                     tile: tuple[int, int, int, int] | None = None) -> None:
    """Causal paged attention for every request of a step (decodes and prefills in any order), in one launch.

    Request ``r`` has query rows ``query_start_loc[r] .. query_start_loc[r + 1] - 1``; its row ``i`` sits at
    absolute position ``seq_lens[r] - q_len + i`` and attends to keys ``0..that position`` of its context (the
    ``seq_lens[r] - q_len`` tokens before this step, prefix-cached or earlier chunks, then this step's own).
    Padding requests, with ``q_len`` 0 (``query_start_loc`` repeats) or ``seq_lens`` 0 (any ``seq_len <
    q_len``), write nothing. The launch grid is ``(T // BLOCK_Q + num_reqs, num_kv_heads)`` with ``T =
    query.shape[0]``, and every per-request length is read on the device: no host synchronization, and a CUDA
    graph captured for one ``(T, num_reqs)`` replays correctly for any step of that padded shape after its
    device tensors are refilled. FlashAttention-2 (Dao, 2023) tiles with an online softmax; the book's
    chapter 6; GQA heads packed into the tile rows and the request found by binary search over
    ``query_start_loc``, after vLLM's Triton unified-attention kernel. See the module docstring.

    Args:
        query: [T, num_heads, head_size] fp16/bf16/fp32, last dimension contiguous; T may include padded
            token rows past ``query_start_loc[num_reqs]``.
        kv_cache: [2, num_blocks, block_size, num_kv_heads, head_size], query's dtype, last dimension
            contiguous, already holding this step's K/V (the KV write runs first).
        block_table: [>= num_reqs, max_blocks] int32, rows contiguous (device); entries past a request's
            length are never read.
        seq_lens: [>= num_reqs] int32 (device), context plus this step's tokens of each request.
        query_start_loc: [>= num_reqs + 1] int32 (device), prefix sums of the query lengths from 0, with
            ``query_start_loc[num_reqs] <= T``.
        out: [T, num_heads, head_size], last dimension contiguous; written at the rows of requests with
            ``0 < q_len <= seq_len``, in its own dtype; every other row is left untouched.
        num_reqs: requests in the step, padding requests included (sizes the grid: keep it fixed for a graph).
        scale: softmax scale (usually head_size ** -0.5).
        tile: optional ``(block_m, block_n, num_warps, num_stages)`` overriding the defaults (benchmarks);
            see ``varlen_tile``.

    Raises:
        ValueError: on mismatched shapes or dtypes, num_heads not a multiple of num_kv_heads, a
            non-contiguous last dimension (query, out, cache, block-table rows), tables shorter than
            ``num_reqs``, or a bad ``tile``. Lengths on the device are not checked (that would synchronize).
    """
    if num_reqs < 0:
        raise ValueError(f"num_reqs must be non-negative, got {num_reqs}")
    if num_reqs == 0:
        return
    if query.dim() != 3 or kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(f"expected query [T, heads, head_size] and kv_cache [2, blocks, block_size, kv_heads, "
                         f"head_size], got {tuple(query.shape)} and {tuple(kv_cache.shape)}")
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    num_tokens, num_heads, _ = query.shape
    if query.shape[2] != head_size or num_heads % num_kv_heads:
        raise ValueError(f"query {tuple(query.shape)} does not match kv_cache {tuple(kv_cache.shape)} (head size, "
                         f"or num_heads not a multiple of num_kv_heads)")
    if out.shape != query.shape:
        raise ValueError(f"out {tuple(out.shape)} must have query's shape {tuple(query.shape)}")
    if kv_cache.dtype != query.dtype:
        raise ValueError(f"kv_cache dtype {kv_cache.dtype} differs from query dtype {query.dtype}")
    if query.stride(2) != 1 or out.stride(2) != 1 or kv_cache.stride(4) != 1 or block_table.stride(1) != 1:
        raise ValueError("query, out and kv_cache need a contiguous last dimension, block_table contiguous rows")
    if block_table.shape[0] < num_reqs or seq_lens.shape[0] < num_reqs or query_start_loc.shape[0] < num_reqs + 1:
        raise ValueError(f"num_reqs {num_reqs} exceeds block_table {tuple(block_table.shape)}, seq_lens "
                         f"{tuple(seq_lens.shape)} or query_start_loc {tuple(query_start_loc.shape)}")
    group = num_heads // num_kv_heads
    block_q, block_m, block_n, num_warps, num_stages = varlen_tile(query.dtype, head_size, group, tile)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    grid = (num_tokens // block_q + num_reqs, num_kv_heads)
    _varlen_kernel[grid](
        query, k_cache, v_cache, block_table, seq_lens, query_start_loc, out,
        scale * LOG2E, num_reqs,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
        BLOCK_SIZE=block_size, GROUP=group, GROUP_P2=triton.next_power_of_2(group),
        HEAD_SIZE=head_size, HEAD_P2=max(16, triton.next_power_of_2(head_size)),
        BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )


__all__ = ["varlen_attention", "varlen_tile"]
