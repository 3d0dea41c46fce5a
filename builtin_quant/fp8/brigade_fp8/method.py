"""Fp8LinearMethod: a linear layer whose weight is stored as FP8 (e4m3) with per-output-channel scales.

Online quantization (vLLM's ``fp8`` method on an unquantized checkpoint): the layer first holds the
checkpoint's weight in the model dtype, so the ordinary HF shard loaders fill it; once every
tensor is loaded, ``process_weights_after_loading`` quantizes it and frees the original, halving
the weight memory versus bf16 (quartering it versus fp32).

``apply`` is weight-only: activations stay in the model dtype. Because the scale is per output
channel, ``x @ (q * s[:, None]).T == (x @ q.T) * s``, so the product runs on the upcast FP8 matrix
(exact: every e4m3 value is representable in bf16/fp16/fp32) and the scale multiplies the
``[T, out]`` result instead of the larger ``[out, in]`` weight. This path is correct on every
device; a fused FP8 GEMM (``torch._scaled_mm`` on compute capability >= 8.9) is not used yet.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brigade.model_executor.layers.linear_method import LinearMethod
from brigade.model_executor.weight_utils import set_weight_attrs

from brigade_fp8.quantize import FP8_DTYPE, quantize_fp8_per_channel


class Fp8LinearMethod(LinearMethod):
    """Weight ``[sum(output_sizes), input_size]`` in ``float8_e4m3fn`` plus ``weight_scale`` [out] fp32.

    Invariant after ``process_weights_after_loading``: ``layer.weight.float() * layer.weight_scale[:, None]``
    approximates the checkpoint's merged weight (per-element relative error <= 2**-4 in e4m3's
    normal range; see ``brigade_fp8.quantize``).
    """

    def create_weights(self, layer: nn.Module, *, input_size: int, output_sizes: list[int],
                       dtype: torch.dtype) -> None:
        # Checkpoint format: a plain weight in the model dtype, so merged layers load HF shards as usual.
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=dtype), requires_grad=False)
        set_weight_attrs(weight, {"output_dim": 0})
        layer.register_parameter("weight", weight)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Replace ``layer.weight`` by its FP8 version and add ``layer.weight_scale`` (idempotent)."""
        if layer.weight.dtype == FP8_DTYPE:
            return
        qweight, scale = quantize_fp8_per_channel(layer.weight.data)
        # Re-registering drops the last reference to the model-dtype tensor, which frees it.
        layer.weight = nn.Parameter(qweight, requires_grad=False)
        layer.register_parameter("weight_scale", nn.Parameter(scale, requires_grad=False))

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Args: x [T, input_size] in the model dtype. Returns [T, sum(output_sizes)] in x's dtype."""
        out = F.linear(x, layer.weight.to(x.dtype)) * layer.weight_scale.to(x.dtype)
        if bias is not None:
            out = out + bias
        return out
