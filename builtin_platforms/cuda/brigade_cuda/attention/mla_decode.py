"""Latent-attention decode in one Triton kernel: single-token queries over their requests' paged latents.

One program takes one request and ``BLOCK_H`` of its heads. Their absorbed queries (``q_nope W_UK``, [BLOCK_H, L])
and rotated channels ([BLOCK_H, R]) stay in registers while the program walks the request's context ``BLOCK_N``
tokens at a time through its block table. Each latent row is read once for all the heads of the program: the
compressed part ``c`` gives both the scores (with the rotary part) and the output, as in FlashMLA and vLLM's
Triton MLA decode. Scores are accumulated with an online softmax (FlashAttention-2's running max and sum) in fp32.
Same contract as ``LatentDecode.forward_native``; nothing depends on host values, so CUDA graphs can capture it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_H = 16  # heads a program (tl.dot needs 16 rows)
BLOCK_N = 32  # context tokens an iteration


@triton.jit
def _mla_decode_kernel(q_lat_ptr, q_pe_ptr, cache_ptr, table_ptr, seq_lens_ptr, out_ptr, scale, H, L, R,
                       stride_qd, stride_qh, stride_pd, stride_ph, stride_cb, stride_cs, stride_td, stride_od,
                       stride_oh, BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_L: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    d = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ls = tl.arange(0, BLOCK_L)
    rs = tl.arange(0, BLOCK_R)
    head_ok, l_ok, r_ok = heads < H, ls < L, rs < R
    q = tl.load(q_lat_ptr + d * stride_qd + heads[:, None] * stride_qh + ls[None, :],
                mask=head_ok[:, None] & l_ok[None, :], other=0.0)  # [BLOCK_H, BLOCK_L]
    q_pe = tl.load(q_pe_ptr + d * stride_pd + heads[:, None] * stride_ph + rs[None, :],
                   mask=head_ok[:, None] & r_ok[None, :], other=0.0)  # [BLOCK_H, BLOCK_R]
    seq_len = tl.load(seq_lens_ptr + d)
    m = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    total = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_L), dtype=tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < seq_len
        block = tl.load(table_ptr + d * stride_td + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        rows = block * stride_cb + (n % BLOCK_SIZE) * stride_cs  # [BLOCK_N]
        c = tl.load(cache_ptr + rows[:, None] + ls[None, :], mask=n_ok[:, None] & l_ok[None, :], other=0.0)
        k_pe = tl.load(cache_ptr + rows[:, None] + L + rs[None, :], mask=n_ok[:, None] & r_ok[None, :], other=0.0)
        s = tl.dot(q.to(c.dtype), tl.trans(c)) + tl.dot(q_pe.to(c.dtype), tl.trans(k_pe))  # [BLOCK_H, BLOCK_N]
        s = tl.where(n_ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
        m = m_new
    out = acc / total[:, None]
    tl.store(out_ptr + d * stride_od + heads[:, None] * stride_oh + ls[None, :], out.to(out_ptr.dtype.element_ty),
             mask=head_ok[:, None] & l_ok[None, :])


def mla_decode_cuda(layer, q_latent: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor,
                    block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float, max_seq_len: int
                    ) -> torch.Tensor:
    """The ``"mla_decode"`` kernel: ``LatentDecode.forward_native``'s contract (``max_seq_len`` unused: the
    program reads each request's length on the device)."""
    num_decodes, num_heads, rank = q_latent.shape
    rope = q_pe.shape[-1]
    q_latent, q_pe = q_latent.contiguous(), q_pe.contiguous()
    if cache.stride(-1) != 1:
        raise ValueError("the latent cache's last dimension must be contiguous")
    out = torch.empty_like(q_latent)
    grid = (num_decodes, triton.cdiv(num_heads, BLOCK_H))
    _mla_decode_kernel[grid](
        q_latent, q_pe, cache, block_table, seq_lens, out, float(scale), num_heads, rank, rope,
        q_latent.stride(0), q_latent.stride(1), q_pe.stride(0), q_pe.stride(1), cache.stride(0), cache.stride(1),
        block_table.stride(0), out.stride(0), out.stride(1), BLOCK_SIZE=cache.shape[1], BLOCK_H=BLOCK_H,
        BLOCK_L=max(16, triton.next_power_of_2(rank)), BLOCK_R=max(16, triton.next_power_of_2(rope)),
        BLOCK_N=BLOCK_N)
    return out
