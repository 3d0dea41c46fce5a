"""The attention variants in the Triton kernels: sliding windows, logit soft-capping and attention sinks.

The conventions are the core's (``brigade.attention.variants``, transformers'): the query at position ``p`` sees
keys ``[p - W + 1, p]``; a scaled score ``s`` becomes ``c * tanh(s / c)``; a sink logit per query head joins the
softmax denominator. The kernels keep their scores in log2 units (``s * log2(e)``, for ``exp2``), so the cap is
passed as ``c * log2(e)`` and the sinks are multiplied by ``log2(e)`` when loaded.

Each variant is a constexpr switch: ``SLIDING_WINDOW`` (0: none), ``SOFT_CAP`` (0.0: none, in log2 units) and a
``sinks_ptr`` that is ``None`` without sinks, which Triton turns into a constexpr. A layer without variants
compiles the same code as before the switches existed. The window size is a per-layer constant, so it is
compiled in; the sinks are a [num_heads] tensor (any float dtype, read as fp32) whose address a CUDA graph
captures.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # scores in log2 units: exp(x) = exp2(x * LOG2E)
LOG2E_C = tl.constexpr(LOG2E)


@triton.jit
def soft_cap(s, SOFT_CAP: tl.constexpr):
    """``SOFT_CAP * tanh(s / SOFT_CAP)`` on scores in log2 units (both scaled alike, so the cap commutes with the
    unit). ``tanh(x) = 1 - 2 / (exp(2x) + 1)``, finite for any finite ``s``: saturates to ``±SOFT_CAP``."""
    return SOFT_CAP - (2.0 * SOFT_CAP) / (tl.exp2(s * (2.0 * LOG2E_C / SOFT_CAP)) + 1.0)


@triton.jit
def softmax_start(sinks_ptr, heads, take, BLOCK_M: tl.constexpr):
    """The online softmax's starting ``(max, sum)`` per row: ``(-inf, 0)``, or with sinks ``(sinks[heads] *
    log2(e), 1)`` where ``take`` [M] (the sink's ``exp2(sink - max)`` term). ``heads`` [M] is each row's query
    head; ``take`` is False on padded head rows and on the splits of a split-KV program that must not count the
    sink again (one split of a request carries it)."""
    if sinks_ptr is None:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    else:
        m_i = tl.load(sinks_ptr + heads, mask=take, other=float("-inf")).to(tl.float32) * LOG2E_C
        l_i = tl.where(take, 1.0, 0.0)
    return m_i, l_i


def variant_constexprs(sliding_window: int | None, logits_soft_cap: float | None) -> dict:
    """A kernel launch's ``SLIDING_WINDOW``/``SOFT_CAP`` constexprs (the sinks tensor, or None, is passed as
    ``sinks_ptr`` as it is).

    Raises:
        ValueError: a window below 1 or a cap that is not positive.
    """
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be at least 1, got {sliding_window}")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be positive, got {logits_soft_cap}")
    return {"SLIDING_WINDOW": sliding_window or 0, "SOFT_CAP": logits_soft_cap * LOG2E if logits_soft_cap else 0.0}


__all__ = ["LOG2E", "LOG2E_C", "soft_cap", "softmax_start", "variant_constexprs"]
