"""Varlen paged attention for a whole mixed prefill/decode step in one launch whose grid depends only on the
padded token and request counts, so a CUDA graph can capture it (Dao, "FlashAttention-2",
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

Split-KV (flash-decoding inside the varlen launch; Dao et al., "Flash-Decoding for long-context inference", 2023, as
``decode.py``): without it a decode with a long context is streamed by only ``num_kv_heads`` programs, one key tile
after another (a 32k-token decode made a mixed step 4x slower than the eager split-KV step). A tiny plan kernel
(``varlen_plan``, once per step: every layer reuses it) gives each request with a one-block query (decodes, draft
verification, short chunks) ``s`` splits of its context, at least ``min_chunk`` tokens each, up to ``max_splits``,
and caps them so that all requests' extra programs stay within ``extra``: the grid gets ``extra`` more programs,
which is all a graph has to know. Programs then find their request by binary search over the plan's prefix sums of
work items. The split programs of a (request, KV head) write partial outputs and log-sum-exps to a small persistent
buffer; the last of them to finish (an atomic counter, reset by it) merges them in log-sum-exp weights and writes
the output, so no merge kernel is launched. Every split but the last covers whole key tiles before the query's first
position, visible to every row; the last also takes the causal tail, so every row of every non-empty split sees at
least one key.

The attention variants (``variants.py``) are constexpr switches, as in ``prefill.py``: under a sliding window the
keys start at the window of the block's first query token (a split request splits only the window's keys) and
every tile is masked; with sinks the one-split programs and split 0 of a split request seed their softmax with the
sink, so the merge counts it once. The plan ignores the variants: it is shared by every layer of a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from brigade.attention.fp8_kv import FP8_KV_DTYPE
from brigade_cuda.attention.decode import LOG2E
from brigade_cuda.attention.fp8_kv import kernel_scales
from brigade_cuda.attention.prefill import _attend_causal, _attend_tile
from brigade_cuda.attention.variants import softmax_start, variant_constexprs

PLAN_LANES = 256  # requests the plan kernel takes at a time
DEFAULT_TILE_ROWS = 64  # tile rows (query tokens x packed heads) per program unless ``tile`` says otherwise


# The request count and the block table's width change from step to step outside the graphs (eager mixed
# steps): not specialized, so a new value never compiles a variant mid-serving (see decode.py).
@triton.jit
def _split_wants(query_start_loc_ptr, seq_lens_ptr, r, num_reqs, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                 MIN_CHUNK: tl.constexpr, MAX_SPLITS: tl.constexpr):
    """Per request lane ``r``: its query blocks and the splits it would like (1 unless one block)."""
    valid = r < num_reqs
    q0 = tl.load(query_start_loc_ptr + r, mask=valid, other=0)
    q_len = tl.load(query_start_loc_ptr + r + 1, mask=valid, other=0) - q0
    seq_len = tl.load(seq_lens_ptr + r, mask=valid, other=0)
    live = valid & (q_len > 0) & (seq_len >= q_len)
    blocks = tl.where(live, (q_len + BLOCK_Q - 1) // BLOCK_Q, 0)
    full_end = (seq_len - q_len) // BLOCK_N * BLOCK_N  # keys visible to every row of the request's one block
    want = tl.where(live & (blocks == 1), tl.maximum(tl.minimum(full_end // MIN_CHUNK, MAX_SPLITS), 1), 1)
    return valid, blocks, want


# One compiled variant for every request count (lanes in fixed chunks): a new count never compiles mid-serving.
@triton.jit(do_not_specialize=["num_reqs"])
def _varlen_plan_kernel(query_start_loc_ptr, seq_lens_ptr, plan_ptr, num_reqs,
                        BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                        MIN_CHUNK: tl.constexpr, MAX_SPLITS: tl.constexpr, EXTRA: tl.constexpr):
    """plan[0 .. R]: exclusive prefix sums of each request's work items (plan[R]: their total); plan[R + 1 + r]:
    request r's split count; plan[2R + 1 + r]: its first partial-output slot (split requests only). The split
    cap is the largest of MAX_SPLITS, MAX_SPLITS / 2, ..., 1 whose extra programs (splits - 1, summed) fit EXTRA."""
    lanes = tl.arange(0, BLOCK_R)
    caps = tl.maximum(MAX_SPLITS >> tl.arange(0, 16), 1)  # [16] candidate caps, largest first
    extra = tl.zeros([16], tl.int32)
    for c0 in range(0, num_reqs, BLOCK_R):
        _, _, want = _split_wants(query_start_loc_ptr, seq_lens_ptr, c0 + lanes, num_reqs, BLOCK_Q, BLOCK_N,
                                  MIN_CHUNK, MAX_SPLITS)
        extra += tl.sum(tl.minimum(want[:, None], caps[None, :]) - 1, 0)
    cap = tl.max(tl.where(extra <= EXTRA, caps, 1), 0)
    item0 = 0
    slot0 = 0
    for c0 in range(0, num_reqs, BLOCK_R):
        r = c0 + lanes
        valid, blocks, want = _split_wants(query_start_loc_ptr, seq_lens_ptr, r, num_reqs, BLOCK_Q, BLOCK_N,
                                           MIN_CHUNK, MAX_SPLITS)
        splits = tl.minimum(want, cap)
        items = blocks * splits
        slots = tl.where(splits > 1, splits, 0)
        tl.store(plan_ptr + r, item0 + tl.cumsum(items, 0) - items, mask=valid)
        tl.store(plan_ptr + num_reqs + 1 + r, splits, mask=valid)
        tl.store(plan_ptr + 2 * num_reqs + 1 + r, slot0 + tl.cumsum(slots, 0) - slots, mask=valid)
        item0 += tl.sum(items, 0)
        slot0 += tl.sum(slots, 0)
    tl.store(plan_ptr + num_reqs, item0)


@triton.jit(do_not_specialize=["num_reqs", "stride_bt_r"])
def _varlen_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    plan_ptr, mid_o_ptr, mid_lse_ptr, counter_ptr,
    scale_log2, num_reqs,
    stride_q_t, stride_q_h, stride_out_t, stride_out_h,
    stride_cache_block, stride_cache_tok, stride_cache_h, stride_bt_r, v_scale, sinks_ptr,
    NUM_KV_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_P2: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_P2: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr = False, SLIDING_WINDOW: tl.constexpr = 0, SOFT_CAP: tl.constexpr = 0.0,
):
    # KV_FP8: a float8 e4m3 cache (fp8_kv.py): tiles upcast to the query's dtype, the k scale in scale_log2, the
    # v scale on each output (v_scale is None otherwise).
    item = tl.program_id(0)
    kv_head = tl.program_id(1)
    if item >= tl.load(plan_ptr + num_reqs):  # the grid's slack: no work item here
        return
    # The last request whose first work item is at or before this one (requests without work repeat a start).
    lo: tl.int32 = 0
    hi = num_reqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tl.load(plan_ptr + mid) <= item:
            lo = mid
        else:
            hi = mid
    req = lo
    splits = tl.load(plan_ptr + num_reqs + 1 + req)
    local = item - tl.load(plan_ptr + req)
    j = local // splits  # this program's query block within the request (0 when split)
    split = local % splits
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + req)
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
    head_off = kv_head * stride_cache_h
    kv_end = tl.minimum(seq_len, context_len + (j + 1) * BLOCK_Q)  # keys past the block's last query token
    out_rows = out_ptr + tok[:, None] * stride_out_t + heads[:, None] * stride_out_h + dims[None, :]
    if splits == 1:
        m_i, l_i = softmax_start(sinks_ptr, heads, row_mask, BLOCK_M)
        o = _attend_causal(q, q_pos, context_len + j * BLOCK_Q, kv_end, bt_row, k_cache_ptr, v_cache_ptr,
                           head_off, dims, dim_mask, scale_log2, stride_cache_block, stride_cache_tok, m_i, l_i,
                           BLOCK_M, HEAD_P2, BLOCK_SIZE, BLOCK_N, DOT_PRECISION, KV_FP8, SLIDING_WINDOW, SOFT_CAP)
        if KV_FP8:
            o = o * v_scale
        tl.store(out_rows, o.to(out_ptr.dtype.element_ty), mask=io_mask)
        return

    # Split: this program's whole key tiles before the query (visible to every row), and the last split the
    # causal tail too. An empty split (rounding) leaves l_i 0: it writes weight -inf.
    full_end = context_len // BLOCK_N * BLOCK_N
    if SLIDING_WINDOW:  # only the window's tiles are split, each masked (rows may see none of a tile)
        n_base = tl.maximum(context_len - SLIDING_WINDOW + 1, 0) // BLOCK_N * BLOCK_N
        chunk = tl.cdiv(tl.cdiv(full_end - n_base, splits), BLOCK_N) * BLOCK_N
        n_lo = n_base + split * chunk
    else:
        chunk = tl.cdiv(tl.cdiv(full_end, splits), BLOCK_N) * BLOCK_N
        n_lo = split * chunk
    n_hi = tl.minimum(n_lo + chunk, full_end)
    m_i, l_i = softmax_start(sinks_ptr, heads, tl.where(split == 0, row_mask, False), BLOCK_M)
    acc = tl.zeros([BLOCK_M, HEAD_P2], tl.float32)
    for n0 in range(n_lo, n_hi, BLOCK_N):
        if SLIDING_WINDOW:
            acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, q_pos, n0, kv_end, bt_row, k_cache_ptr, v_cache_ptr,
                                         head_off, dims, dim_mask, scale_log2, stride_cache_block,
                                         stride_cache_tok, BLOCK_SIZE, BLOCK_N, True, DOT_PRECISION, KV_FP8,
                                         SLIDING_WINDOW, SOFT_CAP)
        else:
            acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, q_pos, n0, kv_end, bt_row, k_cache_ptr, v_cache_ptr,
                                         head_off, dims, dim_mask, scale_log2, stride_cache_block,
                                         stride_cache_tok, BLOCK_SIZE, BLOCK_N, False, DOT_PRECISION, KV_FP8, 0,
                                         SOFT_CAP)
    if split == splits - 1:
        for n0 in range(full_end, kv_end, BLOCK_N):
            acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, q_pos, n0, kv_end, bt_row, k_cache_ptr, v_cache_ptr,
                                         head_off, dims, dim_mask, scale_log2, stride_cache_block,
                                         stride_cache_tok, BLOCK_SIZE, BLOCK_N, True, DOT_PRECISION, KV_FP8,
                                         SLIDING_WINDOW, SOFT_CAP)
    has_any = l_i > 0
    first_slot = tl.load(plan_ptr + 2 * num_reqs + 1 + req)
    mid_rows = ((first_slot + split) * NUM_KV_HEADS + kv_head).to(tl.int64) * BLOCK_M + m  # [M]
    tl.store(mid_o_ptr + mid_rows[:, None] * HEAD_P2 + dims[None, :],
             acc / tl.where(has_any, l_i, 1.0)[:, None], mask=io_mask)
    tl.store(mid_lse_ptr + mid_rows, tl.where(has_any, m_i + tl.log2(tl.where(has_any, l_i, 1.0)), float("-inf")),
             mask=row_mask)
    # The last split to finish merges: every thread's stores above are done (barrier) and released (the
    # atomic's acq_rel) before the count; the merger's loads bypass L1 (.cg).
    tl.debug_barrier()
    counter = counter_ptr + first_slot * NUM_KV_HEADS + kv_head
    if tl.atomic_add(counter, 1, sem="acq_rel") == splits - 1:
        tl.store(counter, 0)  # ready for the next step (the same buffer serves every layer and step)
        best = tl.full([BLOCK_M], float("-inf"), tl.float32)
        den = tl.zeros([BLOCK_M], tl.float32)
        num = tl.zeros([BLOCK_M, HEAD_P2], tl.float32)
        for s in range(0, splits):
            rows = ((first_slot + s) * NUM_KV_HEADS + kv_head).to(tl.int64) * BLOCK_M + m
            lse = tl.load(mid_lse_ptr + rows, mask=row_mask, other=float("-inf"), cache_modifier=".cg")
            part = tl.load(mid_o_ptr + rows[:, None] * HEAD_P2 + dims[None, :], mask=io_mask, other=0.0,
                           cache_modifier=".cg")
            new = tl.maximum(best, lse)
            safe = tl.where(new == float("-inf"), 0.0, new)  # both -inf so far: weights 0, not NaN
            alpha = tl.exp2(best - safe)
            w = tl.exp2(lse - safe)
            den = den * alpha + w
            num = num * alpha[:, None] + part * w[:, None]
            best = new
        o = num / tl.where(den > 0, den, 1.0)[:, None]
        if KV_FP8:
            o = o * v_scale
        tl.store(out_rows, o.to(out_ptr.dtype.element_ty), mask=io_mask)


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


@dataclass(frozen=True, slots=True)
class VarlenSplit:
    """How the varlen kernel splits long contexts (see the module docstring).

    min_chunk: fewest keys per split (tokens); max_splits: most splits per request; extra: programs the grid
    holds beyond one per query block (bounds every request's splits together, and the partial-output buffer).
    ``VarlenSplit(extra=0)`` never splits.
    """

    min_chunk: int = 256
    max_splits: int = 16
    extra: int = 64


DEFAULT_SPLIT = VarlenSplit()
# Partial outputs, log-sum-exps and merge counters, per device and layout (a few tens of MB at most): allocated
# on the first call outside a CUDA-graph capture and shared by every layer, step and graph afterwards (the
# counters are reset by the program that merges, so they are all zero between launches).
_split_buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _buffers(device: torch.device, slots: int, num_kv_heads: int, block_m: int, head_p2: int):
    key = (device, slots, num_kv_heads, block_m, head_p2)
    if key not in _split_buffers:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("varlen split buffers must exist before a CUDA-graph capture: run the step once "
                               "eagerly first (the capture's warm-up does)")
        rows = slots * num_kv_heads * block_m
        _split_buffers[key] = (torch.empty(rows * head_p2, dtype=torch.float32, device=device),
                               torch.empty(rows, dtype=torch.float32, device=device),
                               torch.zeros(slots * num_kv_heads, dtype=torch.int32, device=device))
    return _split_buffers[key]


def varlen_plan(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, *, num_reqs: int, block_q: int, block_n: int,
                split: VarlenSplit = DEFAULT_SPLIT) -> torch.Tensor:
    """The step's work plan for ``varlen_attention`` (one tiny launch; every layer of the step may reuse it):
    int32 [3 * num_reqs + 1] on the device, read only by the kernel. ``block_q`` and ``block_n`` are the
    layer's ``varlen_tile`` values; a plan is valid only for a step with these tensors' contents and tiles.

    Raises:
        ValueError: ``num_reqs`` < 1, or a ``split`` with min_chunk < 1, max_splits < 1 or extra < 0.
    """
    if num_reqs < 1:
        raise ValueError(f"num_reqs must be at least 1, got {num_reqs}")
    if split.min_chunk < 1 or not 1 <= split.max_splits < 2 ** 15 or split.extra < 0:
        raise ValueError(f"bad {split}: min_chunk at least 1, max_splits 1 to 32767, extra at least 0")
    plan = torch.empty(3 * num_reqs + 1, dtype=torch.int32, device=seq_lens.device)
    _varlen_plan_kernel[(1,)](
        query_start_loc, seq_lens, plan, num_reqs,
        BLOCK_R=PLAN_LANES, BLOCK_Q=block_q, BLOCK_N=block_n, MIN_CHUNK=split.min_chunk,
        MAX_SPLITS=split.max_splits, EXTRA=split.extra,
    )
    return plan


def _check_operands(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, out: torch.Tensor, num_reqs: int) -> None:
    """Raise ValueError unless the operands are ``varlen_attention``'s (shapes, dtypes, strides; see its Args)."""
    if query.dim() != 3 or kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(f"expected query [T, heads, head_size] and kv_cache [2, blocks, block_size, kv_heads, "
                         f"head_size], got {tuple(query.shape)} and {tuple(kv_cache.shape)}")
    num_kv_heads, head_size = kv_cache.shape[3], kv_cache.shape[4]
    if query.shape[2] != head_size or query.shape[1] % num_kv_heads:
        raise ValueError(f"query {tuple(query.shape)} does not match kv_cache {tuple(kv_cache.shape)} (head size, "
                         f"or num_heads not a multiple of num_kv_heads)")
    if out.shape != query.shape:
        raise ValueError(f"out {tuple(out.shape)} must have query's shape {tuple(query.shape)}")
    if kv_cache.dtype not in (query.dtype, FP8_KV_DTYPE):
        raise ValueError(f"kv_cache dtype {kv_cache.dtype} differs from query dtype {query.dtype} (and is not "
                         "float8_e4m3fn, the fp8 cache)")
    if query.stride(2) != 1 or out.stride(2) != 1 or kv_cache.stride(4) != 1 or block_table.stride(1) != 1:
        raise ValueError("query, out and kv_cache need a contiguous last dimension, block_table contiguous rows")
    if block_table.shape[0] < num_reqs or seq_lens.shape[0] < num_reqs or query_start_loc.shape[0] < num_reqs + 1:
        raise ValueError(f"num_reqs {num_reqs} exceeds block_table {tuple(block_table.shape)}, seq_lens "
                         f"{tuple(seq_lens.shape)} or query_start_loc {tuple(query_start_loc.shape)}")


def varlen_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                     query_start_loc: torch.Tensor, out: torch.Tensor, *, num_reqs: int, scale: float,
                     tile: tuple[int, int, int, int] | None = None, split: VarlenSplit = DEFAULT_SPLIT,
                     plan: torch.Tensor | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
                     sliding_window: int | None = None, logits_soft_cap: float | None = None,
                     sinks: torch.Tensor | None = None) -> None:
    """Causal paged attention for every request of a step (decodes and prefills in any order), in one launch.

    Request ``r`` has query rows ``query_start_loc[r] .. query_start_loc[r + 1] - 1``; its row ``i`` sits at
    absolute position ``seq_lens[r] - q_len + i`` and attends to keys ``0..that position`` of its context (the
    ``seq_lens[r] - q_len`` tokens before this step, prefix-cached or earlier chunks, then this step's own).
    Padding requests, with ``q_len`` 0 (``query_start_loc`` repeats) or ``seq_lens`` 0 (any ``seq_len <
    q_len``), write nothing. The launch grid is ``(T // BLOCK_Q + num_reqs, num_kv_heads)`` with ``T =
    query.shape[0]``, and every per-request length is read on the device: no host synchronization, and a CUDA
    graph captured for one ``(T, num_reqs)`` replays correctly for any step of that padded shape after its
    device tensors are refilled. A request with a one-block query (a decode) and a long context is split into
    up to ``split.max_splits`` chunks merged in the same launch (the grid holds ``split.extra`` more programs).
    FlashAttention-2 (Dao, 2023) tiles with an online softmax; GQA heads packed into the tile rows and the request
    found by binary search over ``query_start_loc``, after vLLM's Triton unified-attention kernel. See the module
    docstring.

    Args:
        query: [T, num_heads, head_size] fp16/bf16/fp32, last dimension contiguous; T may include padded
            token rows past ``query_start_loc[num_reqs]``.
        kv_cache: [2, num_blocks, block_size, num_kv_heads, head_size], query's dtype, last dimension
            contiguous, already holding this step's K/V (the KV write runs first); or float8 e4m3, read as
            ``stored * k_scale`` / ``stored * v_scale`` (``fp8_kv.py``; the scales are ignored otherwise).
        block_table: [>= num_reqs, max_blocks] int32, rows contiguous (device); entries past a request's
            length are never read.
        seq_lens: [>= num_reqs] int32 (device), context plus this step's tokens of each request.
        query_start_loc: [>= num_reqs + 1] int32 (device), prefix sums of the query lengths from 0, with
            ``query_start_loc[num_reqs] <= T``.
        out: [T, num_heads, head_size], last dimension contiguous; written at the rows of requests with
            ``0 < q_len <= seq_len``, in its own dtype; every other row is left untouched.
        num_reqs: requests in the step, padding requests included (sizes the grid: keep it fixed for a graph).
        scale: softmax scale (usually head_size ** -0.5).
        tile: optional ``(block_m, block_n, num_warps, num_stages)`` overriding ``varlen_tile``'s defaults.
        split: how long contexts split (``VarlenSplit``; the default suits the H200).
        plan: this step's ``varlen_plan`` for the same tile and split (computed here when None).
        sliding_window, logits_soft_cap, sinks: the layer's variants (``variants.py``; sinks [num_heads]).

    Raises:
        ValueError: on mismatched shapes or dtypes, num_heads not a multiple of num_kv_heads, a non-contiguous
            last dimension (query, out, cache, block-table rows), tables shorter than ``num_reqs``, a bad ``tile``,
            ``split`` or variant. Lengths on the device are not checked (that would synchronize).
        RuntimeError: the first call for this device and layout is inside a CUDA-graph capture (an eager call
            allocates the split buffers first; a capture's warm-up is one).
    """
    if num_reqs < 0:
        raise ValueError(f"num_reqs must be non-negative, got {num_reqs}")
    if num_reqs == 0:
        return
    _check_operands(query, kv_cache, block_table, seq_lens, query_start_loc, out, num_reqs)
    tile_config = varlen_tile(query.dtype, kv_cache.shape[4], query.shape[1] // kv_cache.shape[3], tile)
    if plan is None:
        plan = varlen_plan(query_start_loc, seq_lens, num_reqs=num_reqs, block_q=tile_config[0],
                           block_n=tile_config[2], split=split)
    _launch(query, kv_cache, block_table, seq_lens, query_start_loc, out, plan, num_reqs=num_reqs, scale=scale,
            tile_config=tile_config, split=split, kv_scales=(k_scale, v_scale), sinks=sinks,
            constexprs=variant_constexprs(sliding_window, logits_soft_cap))


def _launch(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
            query_start_loc: torch.Tensor, out: torch.Tensor, plan: torch.Tensor, *, num_reqs: int, scale: float,
            tile_config: tuple[int, int, int, int, int], split: VarlenSplit,
            kv_scales: tuple[float, float] = (1.0, 1.0), sinks: torch.Tensor | None = None,
            constexprs: dict | None = None) -> None:
    """Launch ``_varlen_kernel`` on checked operands (``varlen_attention``) with ``varlen_tile``'s
    ``(block_q, block_m, block_n, num_warps, num_stages)``, the step's ``plan``, the layer's ``sinks`` and
    variant ``constexprs`` (``variants.variant_constexprs``)."""
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    num_tokens, num_heads, _ = query.shape
    group = num_heads // num_kv_heads
    block_q, block_m, block_n, num_warps, num_stages = tile_config
    head_p2 = max(16, triton.next_power_of_2(head_size))
    mid_o, mid_lse, counters = _buffers(query.device, 2 * split.extra, num_kv_heads, block_m, head_p2)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    grid = (num_tokens // block_q + num_reqs + split.extra, num_kv_heads)
    fp8, k_fold, v_mul, _, _ = kernel_scales(kv_cache, *kv_scales)
    _varlen_kernel[grid](
        query, k_cache, v_cache, block_table, seq_lens, query_start_loc, out,
        plan, mid_o, mid_lse, counters,
        scale * LOG2E * k_fold, num_reqs,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0), v_mul, sinks,
        NUM_KV_HEADS=num_kv_heads, BLOCK_SIZE=block_size, GROUP=group, GROUP_P2=triton.next_power_of_2(group),
        HEAD_SIZE=head_size, HEAD_P2=head_p2,
        BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32", KV_FP8=fp8, **(constexprs or {}),
        num_warps=num_warps, num_stages=num_stages,
    )

__all__ = ["DEFAULT_SPLIT", "VarlenSplit", "varlen_attention", "varlen_plan", "varlen_tile"]
