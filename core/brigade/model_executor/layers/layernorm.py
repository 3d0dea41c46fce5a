"""RMSNorm with an optional fused residual add (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization").

A ``CustomOp``: ``forward_native`` is the reference; a platform may register a fused kernel through
the ``register_kernels`` hook (op ``"rms_norm"``, see ``custom_op``). A kernel reads ``layer.weight``
([hidden_size], model dtype) and ``layer.variance_epsilon`` (float), and may update ``x`` and
``residual`` in place.
"""

from __future__ import annotations

import torch
from torch import nn

from brigade.model_executor.layers.custom_op import CustomOp


class RMSNorm(CustomOp):
    """``y = x / sqrt(mean(x**2) + eps) * weight`` over the last dimension.

    With ``residual`` given, first ``x = x + residual`` and the sum becomes the new residual, the way
    pre-norm decoder layers chain their skip connections (one pass over memory instead of two).
    """

    op_name = "rms_norm"

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        # Set by ``LinearBase.fold_input_norm``: the weight (now all ones) lives in the next projection,
        # which may then normalize inside its GEMM (``LinearBase.forward_normed``).
        self.weight_folded = False

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None
                       ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normalize ``x``, after adding ``residual`` when given.

        Args:
            x: [num_tokens, hidden_size], any float dtype.
            residual: optional [num_tokens, hidden_size], same dtype as ``x``.

        Returns:
            The normalized tensor in ``x``'s dtype, or ``(normalized, x + residual)`` when
            ``residual`` is given. Statistics are computed in fp32; the result is cast back to the
            input dtype before the weight multiply, as HF transformers' LlamaRMSNorm does, so bf16
            outputs round the same way as the reference (bit-identical on the CPU).
        """
        orig_dtype = x.dtype
        x = x.float()
        if residual is not None:
            # Normalize the rounded sum, the tensor an unfused model would see, not the fp32 one.
            residual = (x + residual.float()).to(orig_dtype)
            x = residual.float()
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        x = (x * torch.rsqrt(variance + self.variance_epsilon)).to(orig_dtype)
        x = x * self.weight
        return x if residual is None else (x, residual)

    def mark_weight_folded(self) -> None:
        """Record that the weight now lives in the projection reading this norm's output: the weight becomes all
        ones and ``weight_folded`` is set (called by that projection's ``fold_input_norm`` after it folded)."""
        self.weight.data.fill_(1.0)
        self.weight_folded = True

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.variance_epsilon}, impl={self.impl_name}"


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: ``y = x / sqrt(mean(x**2) + eps) * (1 + weight)``, the weight stored as an offset from one
    (zeros at initialisation), the product taken in fp32 before rounding to ``x``'s dtype, as transformers'
    ``Gemma2RMSNorm``/``Gemma3RMSNorm`` do. Its own class without a kernel op: a platform's ``rms_norm`` kernel
    multiplies by ``weight`` itself, which would be wrong here."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, dtype: torch.dtype = torch.float32):
        super().__init__(hidden_size, eps, dtype=dtype)
        with torch.no_grad():
            self.weight.zero_()

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None
                       ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """As ``RMSNorm.forward_native`` (``residual`` added first, in ``x``'s dtype), with ``1 + weight``.

        Args: x, residual [num_tokens, hidden_size]. Returns the normalized tensor, or ``(normalized, x +
        residual)``, in ``x``'s dtype.
        """
        orig_dtype = x.dtype
        if residual is not None:
            residual = (x.float() + residual.float()).to(orig_dtype)
            x = residual
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon)
        out = (xf * (1.0 + self.weight.float())).to(orig_dtype)
        return out if residual is None else (out, residual)

    def mark_weight_folded(self) -> None:
        raise ValueError("a Gemma norm's weight (an offset from one) cannot be folded into a projection")
