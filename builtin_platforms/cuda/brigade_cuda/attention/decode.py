"""Split-KV paged decode attention (flash-decoding) in Triton (Dao et al., "Flash-Decoding
for long-context inference", 2023).

A decode request has one query token per head but a long context. One program per
``(request, kv head, split)`` runs an online softmax over one contiguous chunk of the request's
context, reading K/V through the block table, for all ``num_heads // num_kv_heads`` query heads that
share the KV head at once (GQA: each K/V row is loaded once for the whole group). A second kernel merges
the per-split partial results with their log-sum-exp weights. With one split the first kernel writes
the output directly and the merge is skipped. The split count is a runtime argument (only "one or
more" is compiled in), so varying it from step to step costs no recompilation.

With ``rope`` (``DecodeRope``; the backend's default for pure-decode steps, ``BRIGADE_CUDA_DECODE_ROPE=0`` off) the
step's query and key arrive unrotated and its K/V are not in the cache: each program rotates the query in
registers, reads the cache up to the new token, the split that owns the new token attends to it from
registers, and split 0 writes its rotated key and value to the cache. A decode layer then launches no
rotary and no KV-write kernel.

Attention variants (``variants.py``, constexpr switches): under a sliding window the splits share only the
window's keys, ``[seq_len - W, seq_len)``: the KV loop starts at the window's first key, and no block before it is
read (what keeps long-context windowed decode as fast as a short context). A soft cap bends every score, the new
token's too; sinks seed split 0's online softmax (the merge counts them once through its log-sum-exp).

CUDA graphs: the launch grid is ``(num_decodes, num_kv_heads, num_splits)`` and every per-request
quantity (context length, chunk bounds) is read on the device, so a graph captured for one
``(num_decodes, num_splits)`` replays correctly for any context lengths. Keep ``num_splits`` fixed
while capturing (``TritonAttentionBackend.decode_num_splits``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from brigade_cuda.attention.fp8_kv import kernel_scales, quantize_fp8
from brigade_cuda.attention.variants import LOG2E, soft_cap, softmax_start, variant_constexprs
from brigade_cuda.pdl import gdc_prologue, pdl_launch, pdl_prefetch


# Values that change from step to step outside the CUDA graphs (the split count, and with it the strides of the
# split buffers; the block table's width) are not specialized: Triton would compile a variant for each of 1,
# multiples of 16 and the rest the first time each appears, a stall of about a second for every running request.
# (stride_mid_h is the split count: a split count first seen while serving would compile a variant then.)
@triton.jit(do_not_specialize=["num_splits", "stride_bt_r", "stride_mid_r", "stride_mid_h"])
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
    scale_log2,
    stride_q_t, stride_q_h, stride_out_t, stride_out_h,
    stride_cache_block, stride_cache_tok, stride_cache_h, stride_bt_r,
    stride_mid_r, stride_mid_h, stride_mid_s, num_splits,
    k_new_ptr, v_new_ptr, positions_ptr, cos_sin_ptr, slot_ptr,
    stride_kn_t, stride_kn_h, stride_vn_t, stride_vn_h, stride_cos_sin,
    k_inv_scale, v_inv_scale, v_scale, sinks_ptr,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_P2: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_P2: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, ROPE: tl.constexpr = False, HALF: tl.constexpr = 1, IS_NEOX: tl.constexpr = True,
    USE_PDL: tl.constexpr = False, PDL_EARLY: tl.constexpr = False, EARLY: tl.constexpr = False,
    KV_FP8: tl.constexpr = False, SLIDING_WINDOW: tl.constexpr = 0, SOFT_CAP: tl.constexpr = 0.0,
):
    # KV_FP8: a float8 e4m3 cache (fp8_kv.py): K/V tiles upcast to the query's dtype, the k scale already in
    # scale_log2, the v scale on the output; with ROPE the new K/V are quantized as the cache stores them.
    # EARLY (with USE_PDL and ROPE): the step's own K/V come from registers, so everything the context loop
    # reads (sequence lengths, block table, cached K/V of earlier tokens) was written before this step, and
    # those loads start before the wait for the previous kernel (the qkv projection), see
    # brigade_cuda/pdl.py. Only the query and the new key/value wait.
    if USE_PDL:
        if EARLY:
            tl.extra.cuda.gdc_launch_dependents()  # the wait comes at the first read of this step's q/k/v
        else:  # see brigade_cuda/pdl.py: wait for the previous kernel, let the next one launch
            gdc_prologue(PDL_EARLY)
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    # Each split owns a BLOCK_N-aligned chunk of this request's context; trailing splits may be empty.
    if SLIDING_WINDOW:  # only the window's keys: every position from first on is visible, no mask needed
        first = tl.maximum(seq_len - SLIDING_WINDOW, 0)
        chunk = tl.cdiv(tl.cdiv(seq_len - first, num_splits), BLOCK_N) * BLOCK_N
        start = first + split * chunk
    else:
        chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    group = tl.arange(0, GROUP_P2)
    heads = kv_head * GROUP + group  # the query heads served by this KV head
    head_mask = group < GROUP
    dims = tl.arange(0, HEAD_P2)
    dim_mask = dims < HEAD_SIZE
    q_rows = q_ptr + req.to(tl.int64) * stride_q_t + heads[:, None] * stride_q_h
    q_mask = head_mask[:, None] & dim_mask[None, :]
    k_row = k_new_ptr + req.to(tl.int64) * stride_kn_t + kv_head * stride_kn_h
    v_row = v_new_ptr + req.to(tl.int64) * stride_vn_t + kv_head * stride_vn_h
    cache_end = end
    cos, sin, partner = dims, dims, dims  # placeholders without ROPE
    if ROPE:  # this step's query and key arrive unrotated; see decode_attention's ``rope``
        last = seq_len - 1  # the new token's position in the context; its K/V is not in the cache yet
        cache_end = tl.minimum(end, last)
        cos, sin, partner = _rope_lanes(positions_ptr + req, cos_sin_ptr, stride_cos_sin, dims, HALF, IS_NEOX)
    if EARLY:  # loaded (after the wait) at the first context tile, or after the loop if there is none
        q = tl.zeros([GROUP_P2, HEAD_P2], q_ptr.dtype.element_ty)
        k_new = tl.zeros([HEAD_P2], k_new_ptr.dtype.element_ty)
        v_new = tl.zeros([HEAD_P2], v_new_ptr.dtype.element_ty)
    else:
        q, k_new, v_new = _load_step(q_rows, q_mask, k_row, v_row, dims, dim_mask, cos, sin, partner, ROPE)

    m_i, l_i = softmax_start(sinks_ptr, heads, tl.where(split == 0, head_mask, False), GROUP_P2)
    acc = tl.zeros([GROUP_P2, HEAD_P2], tl.float32)
    bt_row = block_table_ptr + req.to(tl.int64) * stride_bt_r
    head_off = kv_head * stride_cache_h
    for n0 in range(start, cache_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_mask = pos < cache_end
        block = tl.load(bt_row + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
        row = block * stride_cache_block + (pos % BLOCK_SIZE) * stride_cache_tok + head_off  # [N]
        kv_mask = pos_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_cache_ptr + row[:, None] + dims[None, :], mask=kv_mask, other=0.0)  # [N, D]
        v = tl.load(v_cache_ptr + row[:, None] + dims[None, :], mask=kv_mask, other=0.0)  # [N, D]
        if KV_FP8:
            k = k.to(q_ptr.dtype.element_ty)
            v = v.to(q_ptr.dtype.element_ty)
        if EARLY:
            if n0 == start:
                tl.extra.cuda.gdc_wait()
                q, k_new, v_new = _load_step(q_rows, q_mask, k_row, v_row, dims, dim_mask, cos, sin, partner, ROPE)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [G, N], log2 units
        if SOFT_CAP > 0.0:
            s = soft_cap(s, SOFT_CAP)
        s = tl.where(pos_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    if EARLY:
        tl.extra.cuda.gdc_wait()  # every program waits before it ends (a no-op after the first wait)
        if start >= cache_end:  # no context tile: load this step's q/k/v now
            q, k_new, v_new = _load_step(q_rows, q_mask, k_row, v_row, dims, dim_mask, cos, sin, partner, ROPE)

    if ROPE:
        if KV_FP8:  # the new token is attended to as the cache will hold it
            k_new = quantize_fp8(k_new, k_inv_scale).to(k_cache_ptr.dtype.element_ty)
            v_new = quantize_fp8(v_new, v_inv_scale).to(v_cache_ptr.dtype.element_ty)
        if (last >= start) & (last < end):  # the split that owns the new token attends to it from registers
            s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], 1) * scale_log2  # [G]
            if SOFT_CAP > 0.0:
                s_new = soft_cap(s_new, SOFT_CAP)
            m_new = tl.maximum(m_i, s_new)
            alpha = tl.exp2(m_i - m_new)
            p_new = tl.exp2(s_new - m_new)
            l_i = l_i * alpha + p_new
            acc = acc * alpha[:, None] + p_new[:, None] * v_new.to(tl.float32)[None, :]
            m_i = m_new
        if split == 0:  # and one program per (request, KV head) writes it to the cache (slot -1: padding)
            slot = tl.load(slot_ptr + req).to(tl.int64)
            if slot >= 0:
                dst = (slot // BLOCK_SIZE) * stride_cache_block + (slot % BLOCK_SIZE) * stride_cache_tok + head_off
                tl.store(k_cache_ptr + dst + dims, k_new.to(k_cache_ptr.dtype.element_ty), mask=dim_mask)
                tl.store(v_cache_ptr + dst + dims, v_new.to(v_cache_ptr.dtype.element_ty), mask=dim_mask)

    # An empty split (or a zero-length padding request) has l_i == 0: emit zeros and weight -inf.
    has_any = l_i > 0
    o = acc / tl.where(has_any, l_i, 1.0)[:, None]
    if KV_FP8:
        o = o * v_scale
    out_mask = head_mask[:, None] & dim_mask[None, :]
    if SINGLE_SPLIT:
        tl.store(out_ptr + req.to(tl.int64) * stride_out_t + heads[:, None] * stride_out_h + dims[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        mid = req.to(tl.int64) * stride_mid_r + heads * stride_mid_h + split * stride_mid_s  # [G]
        tl.store(mid_o_ptr + mid[:, None] * HEAD_P2 + dims[None, :], o, mask=out_mask)
        lse = tl.where(has_any, m_i + tl.log2(tl.where(has_any, l_i, 1.0)), float("-inf"))
        tl.store(mid_lse_ptr + mid, lse, mask=head_mask)


@triton.jit
def _load_step(q_rows, q_mask, k_row, v_row, dims, dim_mask, cos, sin, partner, ROPE: tl.constexpr):
    """This step's query [G, D] (rotated with ROPE) and, with ROPE, its new key (rotated, rounded as the rotary
    kernel stores it) and value [D]; without ROPE the key and value are unused placeholders."""
    q = tl.load(q_rows + dims[None, :], mask=q_mask, other=0.0)  # [G, D]
    if ROPE:
        q_pair = tl.load(q_rows + partner[None, :], mask=q_mask, other=0.0).to(tl.float32)
        q = (q.to(tl.float32) * cos[None, :] + q_pair * sin[None, :]).to(q_rows.dtype.element_ty)
        k_new = tl.load(k_row + dims, mask=dim_mask, other=0.0).to(tl.float32) * cos \
            + tl.load(k_row + partner, mask=dim_mask, other=0.0).to(tl.float32) * sin
        k_new = k_new.to(k_row.dtype.element_ty)
        v_new = tl.load(v_row + dims, mask=dim_mask, other=0.0)
    else:
        k_new = tl.zeros([q.shape[1]], k_row.dtype.element_ty)
        v_new = tl.zeros([q.shape[1]], v_row.dtype.element_ty)
    return q, k_new, v_new


@triton.jit
def _rope_lanes(position_ptr, cos_sin_ptr, stride_cos_sin, dims, HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    """Per channel d of a head: cos, signed sin and the partner channel p such that the rotated value is
    ``x[d] * cos + x[p] * sin`` (the pairwise rotation of ``ops/rotary.py``, written per channel). Channels
    past the rotary dimension get cos 1 and sin 0."""
    pos = tl.load(position_ptr).to(tl.int64)
    rotated = dims < 2 * HALF
    if IS_NEOX:  # pairs (i, i + HALF)
        first = dims < HALF
        pair = tl.where(first, dims, dims - HALF)
        partner = tl.where(first, dims + HALF, dims - HALF)
    else:  # pairs (2i, 2i + 1)
        first = dims % 2 == 0
        pair = dims // 2
        partner = tl.where(first, dims + 1, dims - 1)
    cos = tl.load(cos_sin_ptr + pos * stride_cos_sin + pair, mask=rotated, other=1.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cos_sin + HALF + pair, mask=rotated, other=0.0).to(tl.float32)
    sin = tl.where(first, -sin, sin)
    partner = tl.where(rotated, partner, dims)
    return cos, sin, partner


@triton.jit(do_not_specialize=["num_splits", "stride_mid_r", "stride_mid_h"])
def _decode_merge_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr,
    stride_out_t, stride_out_h, stride_mid_r, stride_mid_h, stride_mid_s, num_splits,
    HEAD_SIZE: tl.constexpr, HEAD_P2: tl.constexpr, SPLITS_P2: tl.constexpr, USE_PDL: tl.constexpr = False, PDL_EARLY: tl.constexpr = False,
):
    if USE_PDL:  # see brigade_cuda/pdl.py: wait for the previous kernel, let the next one launch
        gdc_prologue(PDL_EARLY)
    req = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_P2)
    dims = tl.arange(0, HEAD_P2)
    split_mask = splits < num_splits
    mid = req.to(tl.int64) * stride_mid_r + head * stride_mid_h + splits * stride_mid_s  # [S]
    lse = tl.load(mid_lse_ptr + mid, mask=split_mask, other=float("-inf"))
    o = tl.load(mid_o_ptr + mid[:, None] * HEAD_P2 + dims[None, :],
                mask=split_mask[:, None] & (dims[None, :] < HEAD_SIZE), other=0.0)  # [S, D], in flight with lse
    lse_max = tl.max(lse, 0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # all splits empty: weights all 0
    w = tl.exp2(lse - lse_max)  # [S]
    total = tl.sum(w, 0)
    out = tl.sum(o * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + req.to(tl.int64) * stride_out_t + head * stride_out_h + dims,
             out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_SIZE)


def choose_num_splits(num_decodes: int, num_kv_heads: int, max_seq_len: int, num_sms: int,
                      block_n: int = 64, max_splits: int = 32, single_split_len: int = 0) -> int:
    """Pick how many context chunks each decode request is split into.

    Enough ``(request, kv head, split)`` programs to give every SM about two, but no split shorter than
    one ``block_n`` tile. This lands close to the best split count of a sweep over batch sizes and
    context lengths (docs/performance-notes.md). Contexts of at most ``single_split_len`` tokens take one split, which
    saves the merge kernel: a short context is read faster by a few programs than the merge costs.
    All inputs are host integers, so this never synchronizes with the device.
    """
    if max_seq_len <= single_split_len:
        return 1
    programs = max(1, num_decodes * num_kv_heads)
    wanted = -(-2 * num_sms // programs)
    useful = max(1, -(-max_seq_len // block_n))
    return max(1, min(wanted, useful, max_splits))


MERGE_SPLITS_P2 = 32  # the merge's split lanes: one compiled variant for every split count up to 32


@dataclass(frozen=True, slots=True)
class DecodeRope:
    """This step's unrotated keys and values and the rotary table, for ``decode_attention(rope=...)``.

    key, value: [num_tokens, num_kv_heads, head_size] (row i: decode request i), last dimension contiguous;
    positions: [num_tokens] int; slot_mapping: [num_tokens] int (-1: padding, nothing written);
    cos_sin_cache: [max_position, rotary_dim] fp32, cos then sin, rows contiguous; is_neox_style as rotary.
    """

    key: torch.Tensor
    value: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    cos_sin_cache: torch.Tensor
    is_neox_style: bool = True


def _rope_launch_args(rope: DecodeRope | None, query: torch.Tensor, seq_lens: torch.Tensor,
                      k_inv: float | None, v_inv: float | None) -> tuple[tuple, dict]:
    """The split kernel's rope arguments (this step's K/V, positions, table, slots, strides, then the fp8 cache's
    inverse scales, which only its rope write uses) and constexprs; placeholders without ``rope``."""
    if rope is None:
        return (query, query, seq_lens, query, seq_lens, 0, 0, 0, 0, 0, None, None), {}
    args = (rope.key, rope.value, rope.positions, rope.cos_sin_cache, rope.slot_mapping, rope.key.stride(0),
            rope.key.stride(1), rope.value.stride(0), rope.value.stride(1), rope.cos_sin_cache.stride(0), k_inv, v_inv)
    return args, {"ROPE": True, "HALF": rope.cos_sin_cache.shape[1] // 2, "IS_NEOX": rope.is_neox_style}


def decode_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, out: torch.Tensor, *, num_decodes: int, num_splits: int,
                     scale: float, block_n: int = 64, num_warps: int = 4, num_stages: int = 3,
                     rope: DecodeRope | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
                     sliding_window: int | None = None, logits_soft_cap: float | None = None,
                     sinks: torch.Tensor | None = None) -> None:
    """Paged attention for ``num_decodes`` single-token requests, written into ``out[:num_decodes]``.

    Args:
        query: [num_tokens, num_heads, head_size]; row i is the query of decode request i.
        kv_cache: [2, num_blocks, block_size, num_kv_heads, head_size], query's dtype or float8 e4m3 (read as
            ``stored * k_scale`` / ``stored * v_scale``; ``rope`` writes ``x / scale``, see ``fp8_kv.py``).
        block_table: [num_reqs, max_blocks] int32; seq_lens: [num_reqs] int32 (context + this token).
        out: [num_tokens, num_heads, head_size], same dtype as query.
        num_decodes: requests (and leading query rows) to process; num_splits: context chunks per request.
        scale: softmax scale (usually head_size ** -0.5).
        block_n, num_warps, num_stages: tile tuning knobs (tokens per inner step, Triton launch options).
        rope: when given, ``query`` is unrotated and this step's K/V are not in the cache yet: the kernel
            rotates the query and the new key in registers, attends to the new token from registers and
            writes its rotated key and value to the cache (one program per request and KV head), so the
            step needs no rotary and no KV-write kernel. ``query`` is left unrotated.
        sliding_window, logits_soft_cap, sinks: the layer's variants (``variants.py``; sinks [num_heads]).
    """
    if num_decodes == 0:
        return
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    num_heads = query.shape[1]
    group = num_heads // num_kv_heads
    head_p2 = triton.next_power_of_2(head_size)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    precision = "ieee" if query.dtype == torch.float32 else "tf32"
    if num_splits > 1:
        mid_o = torch.empty((num_decodes, num_heads, num_splits, head_p2), dtype=torch.float32,
                            device=query.device)
        mid_lse = torch.empty((num_decodes, num_heads, num_splits), dtype=torch.float32, device=query.device)
    else:
        mid_o = mid_lse = out  # unused by the kernel with a single split
    mid_strides = (num_heads * num_splits, num_splits, 1)
    fp8, k_fold, v_mul, k_inv, v_inv = kernel_scales(kv_cache, k_scale, v_scale)
    rope_args, rope_kw = _rope_launch_args(rope, query, seq_lens, k_inv, v_inv)
    pdl = pdl_launch()
    early = bool(pdl["USE_PDL"] and rope is not None and pdl_prefetch())
    _decode_split_kernel[(num_decodes, num_kv_heads, num_splits)](
        query, k_cache, v_cache, block_table, seq_lens, out, mid_o, mid_lse,
        scale * LOG2E * k_fold,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
        *mid_strides, num_splits, *rope_args, v_mul, sinks,
        BLOCK_SIZE=block_size, GROUP=group, GROUP_P2=max(16, triton.next_power_of_2(group)),
        HEAD_SIZE=head_size, HEAD_P2=head_p2, BLOCK_N=block_n, SINGLE_SPLIT=num_splits == 1,
        DOT_PRECISION=precision, num_warps=num_warps, num_stages=num_stages, EARLY=early, KV_FP8=fp8, **rope_kw,
        **variant_constexprs(sliding_window, logits_soft_cap), **pdl,
    )
    if num_splits > 1:
        _decode_merge_kernel[(num_decodes, num_heads)](
            mid_o, mid_lse, out, out.stride(0), out.stride(1), *mid_strides, num_splits,
            HEAD_SIZE=head_size, HEAD_P2=head_p2, SPLITS_P2=max(MERGE_SPLITS_P2, triton.next_power_of_2(num_splits)),
            num_warps=4,
            **pdl_launch(),
        )


__all__ = ["DecodeRope", "choose_num_splits", "decode_attention"]
