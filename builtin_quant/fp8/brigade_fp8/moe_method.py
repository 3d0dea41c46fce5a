"""Fp8MoEMethod: a mixture-of-experts layer's stacked experts quantized online to FP8 (e4m3), one fp32 scale per
expert and output channel, as vLLM's online ``fp8`` method does for ``FusedMoE`` (there per expert and tensor;
here per channel, the same rule as ``Fp8LinearMethod``'s weights).

After loading, ``w13_weight`` [E, 2I, H] and ``w2_weight`` [E, H, I] become ``float8_e4m3fn`` with
``w13_weight_scale`` [E, 2I] and ``w2_weight_scale`` [E, H] (the layout ``MoEMethod`` fixes); the products keep
activations in the model dtype and dequantize each expert's weights as they use them (W8A16: the core's reference
path on the CPU, brigade-cuda's Triton kernel on CUDA, which converts each FP8 tile in registers).

Tensor parallelism: each rank holds the rows ``[rank * I/tp, ...)`` of every expert's gate and up, whole rows of
``w13``, so their scales are the ones ``-tp 1`` computes, sliced with the rows. ``w2``'s output channels (H) are
not split but its rows are (columns of I), so each rank's row maximum is taken over its slice and then the maximum
over the TP group (``GroupCoordinator.all_reduce_max``): every rank holds the whole row's scale, and its FP8 codes
are ``-tp 1``'s, column for column. Under expert parallelism each rank holds whole experts: nothing to reduce.
"""

from __future__ import annotations

import torch
from torch import nn

from brigade.distributed import get_tp_group
from brigade.model_executor.layers.linear_method import MoEMethod

from brigade_fp8.quantize import FP8_DTYPE, fp8_scale_from_amax, quantize_fp8_rows


class Fp8MoEMethod(MoEMethod):
    """Online per-channel FP8 for a ``FusedMoE`` layer (idempotent: a layer already in FP8 is left alone)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Quantize ``layer.w13_weight`` and ``layer.w2_weight`` in place of the model-dtype ones and set their
        scales. Under ``-tp`` above 1 this is a collective over the TP group (every rank calls it, in the same
        layer order: the loader's module order)."""
        if layer.w13_weight.dtype == FP8_DTYPE:
            return
        w13, w2 = layer.w13_weight.data, layer.w2_weight.data
        scale13 = fp8_scale_from_amax(w13.abs().amax(dim=2))  # [E, 2I]: whole rows on every rank
        amax2 = w2.abs().amax(dim=2).float()  # [E, H], over this rank's columns of I
        if layer.tp_size > 1:
            get_tp_group().all_reduce_max(amax2)
        scale2 = fp8_scale_from_amax(amax2)
        layer.w13_weight = nn.Parameter(quantize_by_expert(w13, scale13), requires_grad=False)
        layer.w2_weight = nn.Parameter(quantize_by_expert(w2, scale2), requires_grad=False)
        layer.w13_weight_scale = nn.Parameter(scale13.contiguous(), requires_grad=False)
        layer.w2_weight_scale = nn.Parameter(scale2.contiguous(), requires_grad=False)


def quantize_by_expert(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``weight`` [E, N, K] divided by ``scale`` [E, N] and rounded to ``float8_e4m3fn`` [E, N, K], one expert at a
    time, so that the fp32 temporaries are one expert's (a Mixtral-8x7B layer's w13 would take 3.8 GB at once)."""
    out = torch.empty(weight.shape, dtype=FP8_DTYPE, device=weight.device)
    for expert in range(weight.shape[0]):
        out[expert] = quantize_fp8_rows(weight[expert], scale[expert])
    return out
