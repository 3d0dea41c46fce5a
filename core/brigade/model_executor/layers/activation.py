"""Gated activations: SiluAndMul (SwiGLU MLPs) and GeluTanhAndMul (Gemma's GeGLU), from Shazeer 2020, "GLU
Variants Improve Transformer".

A ``CustomOp``: ``forward_native`` is the reference; a platform may register a fused kernel through
the ``register_kernels`` hook (op ``"silu_and_mul"``, see ``custom_op``). The op has no parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from brigade.model_executor.layers.custom_op import CustomOp


class SiluAndMul(CustomOp):
    """``silu(x[..., :d]) * x[..., d:]`` where the last dimension of ``x`` is ``2 * d``.

    The first half is the gate projection and the second the up projection, the order in which
    ``MergedColumnLinear`` packs ``gate_up_proj``.
    """

    op_name = "silu_and_mul"

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        """Args: x [num_tokens, 2 * d]. Returns [num_tokens, d] in x's dtype."""
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class GeluTanhAndMul(CustomOp):
    """``gelu_tanh(x[..., :d]) * x[..., d:]``: GeGLU with the tanh approximation of GELU (transformers'
    ``gelu_pytorch_tanh``), the gated activation of Gemma's MLPs (Shazeer 2020). Gate first, up second, as
    ``MergedColumnLinear`` packs ``gate_up_proj``. No kernel op: ``forward_native`` runs on every platform."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        """Args: x [num_tokens, 2 * d]. Returns [num_tokens, d] in x's dtype."""
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]
