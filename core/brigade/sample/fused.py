"""A platform's fused sampler for plain batches: one pass over the logits instead of the Sampler's chain of
tensor ops (the draw is the exponential race of ``sample/topk_topp.py``).

A batch is *plain* when every row is greedy, or every row is random with nothing but a temperature: no
logprobs, masks, grammar, logits processors (logit_bias, min_tokens, min_p, plugins), penalties, top-k/top-p
or per-request seeds. Then the Sampler's order reduces to "fp32, divide by the temperature, argmax or race",
which a platform can run as one kernel that reads the logits once. On a 128k vocabulary that replaces about
ten small kernels per step at batch 1, and at large batches several fp32 passes over ``[B, V]``.

The CUDA plugin's implementation (``brigade_cuda/ops/sampling.py``) is on by default
(``BRIGADE_CUDA_FUSED_SAMPLER=0`` turns it off). A platform registers its function as the kernel op
"fused_sampler" through the ``register_kernels`` hook; the Sampler binds it once per logits device type (the
first step on that device) and reuses it. The function's contract::

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

from brigade.plugins.kernels import kernel_for

__all__ = ["FusedSampler", "fused_sampler"]

FusedSampler = Callable[..., torch.Tensor]


def fused_sampler(device_type: str) -> FusedSampler | None:
    """The "fused_sampler" kernel of the active platform for logits on ``device_type``, or None."""
    return kernel_for("fused_sampler", device_type)
