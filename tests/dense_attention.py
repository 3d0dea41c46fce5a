"""A dense oracle for paged attention with its variants, and one step's paged inputs to check a backend with.

The oracle keeps each request's whole K/V sequence contiguous and computes softmax attention in float64 with a
causal mask, a sliding window (keys ``[p - W + 1, p]`` for the query at ``p``), a logit soft cap
(``c * tanh(s / c)`` after the scale) and sinks (a per-head logit in the denominator), as transformers'
Mistral/Gemma 2/gpt-oss eager attention does. Shared by the CPU tests (tests/attention) and the GPU ones
(tests/cuda).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from brigade.attention.backend import AttentionMetadata
from brigade.attention.fp8_kv import FP8_KV_DTYPE, quantize_kv, round_trip_kv


@dataclass(frozen=True)
class Variant:
    """One combination of the attention variants (None: not used)."""

    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    use_sinks: bool = False

    def backend_kwargs(self, num_heads: int, gen: torch.Generator) -> dict:
        """The variant arguments of ``AttentionBackend.__init__``, sinks drawn from ``gen`` ([H] fp32)."""
        sinks = torch.randn(num_heads, generator=gen) * 2 if self.use_sinks else None
        return {"sliding_window": self.sliding_window, "logits_soft_cap": self.logits_soft_cap, "sinks": sinks}


VARIANTS = {
    "plain": Variant(),
    "window": Variant(sliding_window=20),
    "window_block": Variant(sliding_window=16),
    "softcap": Variant(logits_soft_cap=2.0),
    "sinks": Variant(use_sinks=True),
    "all": Variant(sliding_window=27, logits_soft_cap=3.0, use_sinks=True),
}

# (context already in the cache, new tokens): decodes first, as the runner orders them. Contexts run several
# windows long; fresh prompts and chunks cross window and block boundaries.
STEP = [(90, 1), (37, 1), (5, 1), (0, 1), (0, 45), (0, 3), (64, 30), (13, 50), (100, 17)]


def dense_attention(q, k, v, context_len, scale, *, sliding_window=None, logits_soft_cap=None, sinks=None):
    """q: [L, H, D]; k, v: [context_len + L, Hkv, D]; sinks: [H] or None -> [L, H, D] float64.

    Query i sits at absolute position ``context_len + i``.
    """
    L, H, _ = q.shape
    group = H // k.shape[1]
    kh = k.double().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, S, D]
    vh = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = q.double().transpose(0, 1) @ kh.transpose(1, 2) * scale  # [H, L, S]
    if logits_soft_cap is not None:
        scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
    q_pos = torch.arange(L)[:, None] + context_len
    k_pos = torch.arange(k.shape[0])[None, :]
    mask = k_pos <= q_pos
    if sliding_window is not None:
        mask &= k_pos > q_pos - sliding_window
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.double()[:, None, None].expand(H, L, 1)], dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., : k.shape[0]]
    return (probs @ vh).transpose(0, 1)


@dataclass
class PagedStep:
    """One step's inputs over a paged cache, and each request's whole K/V (as a read of the cache returns it)."""

    query: torch.Tensor  # [num_tokens, H, D]
    key: torch.Tensor  # [num_tokens, Hkv, D]
    value: torch.Tensor
    kv_cache: torch.Tensor  # [2, num_blocks, bs, Hkv, D]
    metadata: AttentionMetadata
    full_k: list[torch.Tensor]  # per request [context + new, Hkv, D]
    full_v: list[torch.Tensor]

    def expected(self, reqs, scale, variant_kwargs) -> torch.Tensor:
        """The oracle's output for every token row, [num_tokens, H, D] float64."""
        outs = [dense_attention(self.query[start:start + new], k, v, ctx, scale, **variant_kwargs)
                for (ctx, new), start, k, v in zip(reqs, self.metadata.query_start_loc_cpu.tolist(),
                                                   self.full_k, self.full_v)]
        return torch.cat(outs)


def make_step(reqs, *, H, Hkv, D, bs, dtype, gen, kv_dtype=None, k_scale=1.0, v_scale=1.0) -> PagedStep:
    """A step for ``reqs`` [(context already cached, new tokens)], decodes first, on the CPU.

    The cache (``kv_dtype``, default ``dtype``; float8 e4m3 stores ``quantize_kv`` at the scales) holds each
    context in shuffled blocks and random garbage elsewhere; block 0 is the null block.
    """
    kv_dtype = kv_dtype or dtype
    fp8 = kv_dtype == FP8_KV_DTYPE
    need = [-(-(c + n) // bs) for c, n in reqs]
    num_blocks = sum(need) + 4
    kv_cache = torch.randn(2, num_blocks, bs, Hkv, D, generator=gen).to(kv_dtype)
    free = torch.randperm(num_blocks - 1, generator=gen).add(1).tolist()
    tables, full_k, full_v, slots, q_rows = [], [], [], [], []
    for (ctx, new), num in zip(reqs, need):
        blocks = [free.pop() for _ in range(num)]
        tables.append(blocks + [0] * (max(need) + 1 - num))
        k = torch.randn(ctx + new, Hkv, D, generator=gen).to(dtype)
        v = torch.randn(ctx + new, Hkv, D, generator=gen).to(dtype)
        pos_slots = [blocks[p // bs] * bs + p % bs for p in range(ctx + new)]
        flat = kv_cache.view(torch.uint8 if fp8 else kv_dtype).view(2, -1, Hkv, D)
        stored_k = quantize_kv(k[:ctx], k_scale).view(torch.uint8) if fp8 else k[:ctx]
        stored_v = quantize_kv(v[:ctx], v_scale).view(torch.uint8) if fp8 else v[:ctx]
        flat[0][pos_slots[:ctx]] = stored_k
        flat[1][pos_slots[:ctx]] = stored_v
        slots += pos_slots[ctx:]
        full_k.append(round_trip_kv(k, k_scale) if fp8 else k)
        full_v.append(round_trip_kv(v, v_scale) if fp8 else v)
        q_rows.append(torch.randn(new, H, D, generator=gen).to(dtype))
    key = torch.cat([k[c:] for k, (c, _) in zip(full_k, reqs)])
    value = torch.cat([v[c:] for v, (c, _) in zip(full_v, reqs)])
    qlens = torch.tensor([n for _, n in reqs], dtype=torch.int32)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int32), qlens.cumsum(0).to(torch.int32)])
    seq_lens = torch.tensor([c + n for c, n in reqs], dtype=torch.int32)
    md = AttentionMetadata(
        num_reqs=len(reqs), num_actual_tokens=int(qsl[-1]), max_query_len=int(qlens.max()),
        max_seq_len=int(seq_lens.max()), num_decodes=next((i for i, (_, n) in enumerate(reqs) if n != 1), len(reqs)),
        query_start_loc=qsl, seq_lens=seq_lens, block_table=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64), query_start_loc_cpu=qsl.clone(),
        seq_lens_cpu=seq_lens.clone())
    return PagedStep(torch.cat(q_rows), key, value, kv_cache, md, full_k, full_v)
