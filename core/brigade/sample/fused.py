"""A platform's fused sampler for plain batches: one pass over the logits instead of the Sampler's chain of
tensor ops (the draw is the exponential race of ``sample/topk_topp.py``).

A batch is *plain* when every row is greedy, or every row is random with nothing but a temperature: no
logprobs, masks, grammar, logits processors (logit_bias, min_tokens, min_p, plugins), penalties, top-k/top-p
or per-request seeds. Then the Sampler's order reduces to "fp32, divide by the temperature, argmax or race",
which a platform can run as one kernel that reads the logits once. On a 128k vocabulary that replaces about
ten small kernels per step at batch 1, and at large batches several fp32 passes over ``[B, V]``.

The CUDA plugin's implementation (``brigade_cuda/ops/sampling.py``) is on by default
(``BRIGADE_CUDA_FUSED_SAMPLER=0`` turns it off). A platform registers its function with
``register_fused_sampler(device_type, fn)`` at worker start-up, like
``register_dense_gemm``; the Sampler looks it up by the logits' device type at each plain step. The
function's contract::

    fn(logits, temperature, *, greedy) -> ids
        logits: [B, V] float (any float dtype; not modified)
        temperature: [B] f32 or None (None: every row at 1.0); ignored when greedy
        greedy: True when every row is greedy (the lowest index among maxima, as ``torch.argmax``)
        ids: [B] int64; random rows follow Categorical(softmax(logits / temperature)); ``torch.manual_seed``
             makes them repeatable (the CUDA function draws its seed from the host's default generator)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["FusedSampler", "fused_sampler", "register_fused_sampler", "unregister_fused_sampler"]

FusedSampler = Callable[..., torch.Tensor]

_FUSED: dict[str, FusedSampler] = {}


def register_fused_sampler(device_type: str, fn: FusedSampler) -> None:
    """Use ``fn`` for plain batches whose logits live on ``device_type`` (contract in the module docstring).

    Raises:
        ValueError: when ``device_type`` already has a different function.
    """
    existing = _FUSED.get(device_type)
    if existing is not None and existing is not fn:
        raise ValueError(f"a fused sampler is already registered for {device_type} "
                         f"({existing.__module__}.{existing.__qualname__})")
    _FUSED[device_type] = fn


def unregister_fused_sampler(device_type: str) -> None:
    """Forget the function for ``device_type`` (plain batches take the Sampler's tensor ops again)."""
    _FUSED.pop(device_type, None)


def fused_sampler(device_type: str) -> FusedSampler | None:
    """The function registered for ``device_type``, or None."""
    return _FUSED.get(device_type)
