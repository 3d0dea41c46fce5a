"""The top-k softmax router of MoE layers in one Triton kernel, with the expert-load count folded in.

In PyTorch a layer's routing is about eight kernels (the fp32 softmax, ``torch.topk``'s gather and sort, the
renormalising sum and division) and the ``/metrics`` expert count four more (``ExpertLoad.record``: the real-token
mask, its casts and a scatter-add); at one token they took almost a quarter of a Qwen3-30B-A3B decode layer
(``docs/performance-notes.md``). Here one program per token loads the
token's logits, takes the softmax in fp32, picks the ``top_k`` largest probabilities one after the other (ties to
the lower expert id), renormalises them when the config says so (with ``SOFTMAX_AFTER``, gpt-oss's router, it
picks the largest logits and takes the softmax over those alone), stores weights and ids, and adds the token's
assignments to the layer's row of the expert counts with atomics when the token is a real one (rows of a replayed
CUDA graph past the step's token count are padding). Same contract as ``TopKRouter.forward_native``; vLLM's
``topk_softmax`` CUDA kernel is the model.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _topk_router_kernel(logits_ptr, weights_ptr, ids_ptr, counts_ptr, num_real_ptr, E, stride_t,
                        TOP_K: tl.constexpr, K_POW2: tl.constexpr, BLOCK_E: tl.constexpr, RENORMALIZE: tl.constexpr,
                        COUNT: tl.constexpr, SOFTMAX_AFTER: tl.constexpr):
    t = tl.program_id(0)
    offs = tl.arange(0, BLOCK_E)
    ok = offs < E
    x = tl.load(logits_ptr + t.to(tl.int64) * stride_t + offs, mask=ok, other=float("-inf")).to(tl.float32)
    if SOFTMAX_AFTER:  # pick among the logits themselves; the softmax comes over the picked ones
        q = tl.where(ok, x, float("-inf"))
    else:
        p = tl.exp(x - tl.max(x, 0))
        p = tl.where(ok, p, 0.0)
        p = p / tl.sum(p, 0)
        q = tl.where(ok, p, -1.0)  # probabilities still to pick from; -1 below any of them
    slots = tl.arange(0, K_POW2)
    w = tl.zeros((K_POW2,), dtype=tl.float32)
    ids = tl.zeros((K_POW2,), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(q, 0)
        idx = tl.min(tl.where(q == best, offs, BLOCK_E), 0)  # the lowest expert id among equal probabilities
        idx = tl.minimum(idx, E - 1)  # NaN logits match nothing: an id in range, never a write out of bounds
        w = tl.where(slots == j, best, w)
        ids = tl.where(slots == j, idx, ids)
        q = tl.where(offs == idx, float("-inf") if SOFTMAX_AFTER else -1.0, q)
    used = slots < TOP_K
    if SOFTMAX_AFTER:  # slot 0 holds the largest picked logit
        e = tl.where(used, tl.exp(w - tl.max(tl.where(used, w, float("-inf")), 0)), 0.0)
        w = e / tl.sum(e, 0)
    elif RENORMALIZE:
        w = w / tl.sum(tl.where(used, w, 0.0), 0)
    out = t.to(tl.int64) * TOP_K + slots
    tl.store(weights_ptr + out, w, mask=used)
    tl.store(ids_ptr + out, ids.to(tl.int64), mask=used)
    if COUNT:
        real = (slots * 0 + t) < tl.load(num_real_ptr)  # per slot, so the mask is a block like the values
        tl.atomic_add(counts_ptr + ids, tl.full((K_POW2,), 1, tl.int64), mask=used & real, sem="relaxed")


def topk_router(router_logits: torch.Tensor, top_k: int, renormalize: bool, counts: torch.Tensor | None = None,
                num_tokens: torch.Tensor | None = None, softmax_after_topk: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ``top_k`` experts by softmax probability, and (optionally) their count.

    Args:
        router_logits: [T, E] fp16/bf16/fp32 on CUDA, last dimension contiguous.
        top_k: experts per token, 1 <= top_k <= E.
        renormalize: divide the chosen probabilities by their sum.
        counts: optional [E] int64, contiguous: each real token's assignments are added to it (atomics).
        num_tokens: with ``counts``, a 0-d int64 device tensor: rows at or past it are not counted.
        softmax_after_topk: the largest logits, then a softmax over those (gpt-oss); ``renormalize`` is moot.

    Returns:
        (topk_weights [T, top_k] float32, topk_ids [T, top_k] int64), by decreasing weight, ties to the lower id.
    """
    num_tokens_t, num_experts = router_logits.shape
    weights = torch.empty(num_tokens_t, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(num_tokens_t, top_k, dtype=torch.int64, device=router_logits.device)
    if num_tokens_t == 0:
        return weights, ids
    block_e = triton.next_power_of_2(num_experts)
    count = counts is not None
    _topk_router_kernel[(num_tokens_t,)](
        router_logits, weights, ids, counts if count else ids, num_tokens if count else ids, num_experts,
        router_logits.stride(0), TOP_K=top_k, K_POW2=triton.next_power_of_2(top_k), BLOCK_E=block_e,
        RENORMALIZE=renormalize, COUNT=count, SOFTMAX_AFTER=softmax_after_topk, num_warps=1 if block_e <= 256 else 4)
    return weights, ids


def topk_router_cuda(layer, router_logits: torch.Tensor, counts: torch.Tensor | None = None,
                     num_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``"moe_topk_router"`` kernel: ``TopKRouter.forward_native``'s contract on CUDA."""
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    return topk_router(router_logits, layer.top_k, layer.renormalize, counts, num_tokens, layer.softmax_after_topk)
