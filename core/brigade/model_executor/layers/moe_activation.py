"""The gated activations of mixture-of-experts experts: ``act(gate) * up`` between the gate/up and down products.

Two variants exist in the checkpoints Brigade serves:

* ``"silu"``: SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"), ``silu(gate) * up``: Mixtral, Qwen MoE.
* ``"swigluoai"``: gpt-oss's clamped SwiGLU (transformers' ``GptOssExperts._apply_gate``; vLLM's
  ``swigluoai_and_mul``): ``gate`` clamped above at ``limit``, ``up`` to ``[-limit, limit]``, then
  ``gate * sigmoid(alpha * gate) * (up + 1)``.

The activation is a constant of the ``FusedMoE`` layer; the reference path (``moe_act_and_mul``) and the fast
kernels (brigade-cuda's Triton fused MoE, ``ACTIVATION`` constexpr) read ``name``, ``alpha`` and ``limit``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

MOE_ACTIVATIONS = ("silu", "swigluoai")


@dataclass(frozen=True, slots=True)
class MoEActivation:
    """One gated activation and its constants (``alpha``, ``limit``: used by ``"swigluoai"`` only).

    Raises:
        ValueError: a name not in ``MOE_ACTIVATIONS``, or a non-positive ``limit``.
    """

    name: str = "silu"
    alpha: float = 1.702  # the sigmoid's gain (gpt-oss's ``swiglu_alpha``)
    limit: float = 7.0  # the clamp of gate (above) and up (both sides) (gpt-oss's ``swiglu_limit``)

    def __post_init__(self):
        if self.name not in MOE_ACTIVATIONS:
            raise ValueError(f"expert activation {self.name!r} is not one of {', '.join(MOE_ACTIVATIONS)}")
        if self.limit <= 0:
            raise ValueError(f"the clamped SwiGLU's limit must be positive, got {self.limit}")


SILU = MoEActivation()


def moe_act_and_mul(gate: torch.Tensor, up: torch.Tensor, activation: MoEActivation = SILU) -> torch.Tensor:
    """Args: gate, up [n, I] in the model dtype. Returns ``act(gate) * up`` [n, I] in their dtype, computed as
    transformers computes it (elementwise ops in that dtype)."""
    if activation.name == "silu":
        return F.silu(gate) * up
    gate = gate.clamp(max=activation.limit)
    up = up.clamp(min=-activation.limit, max=activation.limit)
    return (up + 1) * (gate * torch.sigmoid(gate * activation.alpha))
