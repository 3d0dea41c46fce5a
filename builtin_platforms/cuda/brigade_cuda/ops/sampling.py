"""The fused sampler for plain batches on CUDA (``brigade.sample.fused``): greedy argmax or the exponential
race, reading the logits once.

Two kernels. The first splits each row into segments, one program per (row, segment): it loads the logits
in their own dtype, converts to fp32, divides by the row's temperature, and for a random row subtracts
``log E`` with ``E = -log(1 - U)`` an Exp(1) draw from Triton's Philox generator (``tl.rand``), keyed by a
seed drawn from the host's default generator (``torch.manual_seed`` repeats it) and by the element's flat index; it keeps the segment's
best score and the lowest index reaching it. The second picks, per row, the best segment (the lowest on
ties). ``argmax_i (x_i - log E_i)`` is the race ``argmax_i p_i / E_i``, distributed as Categorical(p) for
``p = softmax(x)`` (see ``brigade.sample.topk_topp.exponential_race_sample``); a greedy row is the plain argmax,
ties resolved to the lowest index as ``torch.argmax`` does.

Status: on by default (``BRIGADE_CUDA_FUSED_SAMPLER=0`` turns it off). Its GPU tests are
``tests/cuda/test_fused_sampler_cuda.py``; its effect on latency is in ``docs/performance-notes.md``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TARGET_PROGRAMS = 1024  # (row, segment) programs per call, enough to spread a small batch over the GPU
BLOCK = 512  # logits per program per loop step; segments are whole multiples of it
MAX_SEGMENTS = 256  # per row


def launch_config(rows: int, vocab: int) -> tuple[int, int, int]:
    """(seg_len, num_segs, segs_p2) for ``rows`` rows of ``vocab`` logits.

    Only the runtime values depend on the batch: ``BLOCK`` and ``segs_p2`` (the row kernel's constexpr) are
    fixed by the vocabulary, and ``seg_len`` is always a multiple of ``BLOCK``, so the kernels compile once per
    (dtype, greedy / random / temperature) and never again while a server's batch size moves (a Triton
    compile is a stall of about a second for every running request).
    """
    want = max(1, min(MAX_SEGMENTS, TARGET_PROGRAMS // max(rows, 1), triton.cdiv(vocab, BLOCK)))
    seg_len = triton.cdiv(triton.cdiv(vocab, want), BLOCK) * BLOCK
    segs_p2 = max(2, triton.next_power_of_2(min(MAX_SEGMENTS, triton.cdiv(vocab, BLOCK))))
    return seg_len, triton.cdiv(vocab, seg_len), segs_p2


@triton.jit(do_not_specialize=["seed", "num_segs"])  # a seed divisible by 16 must not compile a variant
def _segment_best_kernel(logits_ptr, temp_ptr, seed, best_ptr, where_ptr, V, stride_row, seg_len, num_segs,
                         HAS_TEMP: tl.constexpr, RANDOM: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    seg = tl.program_id(1)
    start = seg * seg_len
    stop = tl.minimum(start + seg_len, V)
    if HAS_TEMP:
        inv_t = 1.0 / tl.load(temp_ptr + row)
    best = float("-inf")
    where = start
    for k0 in range(start, stop, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        ok = offs < stop
        x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offs, mask=ok, other=float("-inf")).to(tl.float32)
        if HAS_TEMP:
            x = x * inv_t
        if RANDOM:
            u = tl.rand(seed, row * V + offs)  # [0, 1)
            e = tl.maximum(-tl.log(1.0 - u), 1.1754943508222875e-38)  # Exp(1), kept > 0 so log stays finite
            x = x - tl.log(e)
        x = tl.where(ok, x, float("-inf"))
        m, i = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
        if m > best:  # strictly: an earlier chunk keeps a tie
            best = m
            where = k0 + i
    tl.store(best_ptr + row * num_segs + seg, best)
    tl.store(where_ptr + row * num_segs + seg, where)


@triton.jit(do_not_specialize=["num_segs"])
def _row_best_kernel(best_ptr, where_ptr, out_ptr, num_segs, SEGS_P2: tl.constexpr):
    row = tl.program_id(0)
    segs = tl.arange(0, SEGS_P2)
    ok = segs < num_segs
    best = tl.load(best_ptr + row * num_segs + segs, mask=ok, other=float("-inf"))
    m, s = tl.max(best, 0, return_indices=True, return_indices_tie_break_left=True)
    s = tl.where(m == float("-inf"), 0, s)  # every score -inf (all logits masked): segment 0's first token
    tl.store(out_ptr + row, tl.load(where_ptr + row * num_segs + s).to(tl.int64))


def fused_sample(logits: torch.Tensor, temperature: torch.Tensor | None, *, greedy: bool) -> torch.Tensor:
    """One token per row of ``logits`` (contract: ``brigade.sample.fused``).

    Args:
        logits: [B, V] fp16/bf16/fp32 on a CUDA device, last dimension contiguous; not modified.
        temperature: [B] f32 or None (every row at 1.0); ignored when ``greedy``.
        greedy: every row takes its argmax (lowest index among maxima).

    Returns: [B] int64 token ids. Random rows take their Philox seed from the host's default generator.

    Raises:
        ValueError: on a non-2-D input or a non-contiguous last dimension.
    """
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"fused_sample needs [B, V] logits with a contiguous last dimension, got "
                         f"{tuple(logits.shape)} with strides {logits.stride()}")
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    seg_len, num_segs, segs_p2 = launch_config(rows, vocab)
    best = torch.empty((rows, num_segs), dtype=torch.float32, device=logits.device)
    where = torch.empty((rows, num_segs), dtype=torch.int32, device=logits.device)
    random = not greedy
    # Drawn on the host (torch.manual_seed seeds it too): a device draw would be one more kernel per step.
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,)).item()) if random else 0
    has_temp = random and temperature is not None
    _segment_best_kernel[(rows, num_segs)](
        logits, temperature if has_temp else best, seed, best, where, vocab, logits.stride(0), seg_len, num_segs,
        HAS_TEMP=has_temp, RANDOM=random, BLOCK=BLOCK, num_warps=4)
    _row_best_kernel[(rows,)](best, where, out, num_segs, SEGS_P2=segs_p2, num_warps=4)
    return out


__all__ = ["fused_sample", "launch_config"]
