"""Fp8LinearMethod: a linear layer held as FP8 (e4m3) weights with per-output-channel scales, applied as a W8A8
product (``brigade_fp8.gemm``: FP8 tensor cores on CUDA, an fp32 emulation elsewhere), and on CUDA at decode
sizes as a W8A16 one (``brigade_fp8.decode_gemm``, the platform kernels ``fp8_gemm``, ``fp8_silu_mul_gemm`` and
``fp8_residual_gemm``: activations in the model dtype, each FP8 weight byte read once).

What the checkpoint holds is described by an ``Fp8Scheme``:

* online (``--quantization fp8`` on an unquantized checkpoint, vLLM's online ``fp8``): the layer first holds the
  checkpoint's weight in the model dtype, so the ordinary shard loaders fill it; ``process_weights_after_loading``
  quantizes it per output channel and frees the original;
* serialized: ``weight`` is already ``float8_e4m3fn`` [N, K] and its scale is per tensor (``weight_scale``, one
  per merged shard), per output channel (compressed-tensors' ``weight_scale`` [N, 1]) or per 128x128 block
  (``weight_scale_inv`` of ``quant_method: fp8`` checkpoints, compressed-tensors' ``weight_scale`` for
  ``FP8_BLOCK``: [ceil(N / 128), ceil(K / 128)]); a static scheme adds the activations' ``input_scale`` (one per
  shard; the layer uses their maximum, as vLLM does, since the shards read the same input).

Per-tensor and per-channel checkpoints load into one scale per output channel (per-tensor shard scales expand
exactly to their rows), so they run the rowwise FP8 GEMM, activations quantized per token (dynamic) unless the
checkpoint gives a static ``input_scale``; on CUDA, batches of up to ``BRIGADE_FP8_DECODE_ROWS`` rows (16) take
the decode kernels instead, whose activations stay in the model dtype (a static ``input_scale`` plays no part
there). Block-scaled layers keep their [rows, cols] block scales and run
``gemm.fp8_block_gemm`` (activations per 1x``block[1]`` group, as the scheme says; a dequantizing product).
Scales that are not finite and positive are refused at load, naming the layer.

Tensor parallelism (vLLM's FP8 sharding): ``weight`` is split like a dense weight (output rows on column-parallel
layers, input columns on row-parallel ones, ``input_dim`` 1); per-channel scales follow the output rows;
per-tensor weight scales and ``input_scale`` are whole on every rank; block scales follow both, which needs the
weight block to divide each rank's rows (column-parallel) or columns (row-parallel), refused otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from brigade.model_executor.layers.linear_method import LinearMethod, input_split
from brigade.model_executor.weight_utils import set_weight_attrs
from brigade.plugins.kernels import kernel_for

from brigade_fp8.quantize import FP8_DTYPE, quantize_fp8_per_channel


@dataclass(frozen=True)
class Fp8Scheme:
    """How a checkpoint stores one FP8 layer.

    Attributes:
        serialized: the checkpoint holds FP8 weights (False: online quantization of a model-dtype weight).
        weight_strategy: "tensor", "channel" or "block" (serialized only; online is per channel).
        block: (rows, cols) of a weight block for "block", e.g. (128, 128).
        static_input: the checkpoint holds a per-tensor ``input_scale`` for the activations.
        scale_name: the weight scale's checkpoint name (``weight_scale``, or ``weight_scale_inv`` for
            ``quant_method: fp8`` block checkpoints).
    """

    serialized: bool = False
    weight_strategy: str = "channel"
    block: tuple[int, int] | None = None
    static_input: bool = False
    scale_name: str = "weight_scale"


ONLINE = Fp8Scheme()


def _param(data: torch.Tensor, attrs: dict) -> nn.Parameter:
    p = nn.Parameter(data, requires_grad=False)
    set_weight_attrs(p, attrs)
    return p


def _ragged(output_sizes: list[int], bn: int) -> bool:
    """Whether a merged layer has a projection whose rows end inside a ``bn``-row weight block."""
    return len(output_sizes) > 1 and any(size % bn for size in output_sizes)


def _block_scale_rows(scale: torch.Tensor, output_sizes: list[int], bn: int) -> torch.Tensor:
    """A merged layer's block scales as the product reads them. ``scale`` holds each shard's
    ``ceil(rows / bn)`` scale rows one after another ([sum, ceil(K / bk)] fp32). When every shard is whole blocks
    this is the [ceil(N / bn), ceil(K / bk)] grid of the merged weight, returned as is. Otherwise (a projection
    ending inside a block: SmolLM2's 576-row q and 192-row k, v under 128-row blocks) each shard's rows are
    expanded to one scale row per output row: [N, ceil(K / bk)], read with blocks of (1, bk)."""
    if not _ragged(output_sizes, bn):
        return scale
    parts, start = [], 0
    for size in output_sizes:
        rows = -(-size // bn)
        parts.append(scale[start:start + rows].repeat_interleave(bn, dim=0)[:size])
        start += rows
    return torch.cat(parts)


class Fp8LinearMethod(LinearMethod):
    """After ``process_weights_after_loading``: ``weight`` [N, K] ``float8_e4m3fn``, ``weight_scale`` [N] fp32 (so
    ``weight.float() * weight_scale[:, None]`` approximates the checkpoint's merged weight; for a block-scaled
    scheme [ceil(N / bn), ceil(K / bk)], one scale per block, or [N, ceil(K / bk)] when a merged projection ends
    inside a block), and ``input_scale``
    (a 1-element fp32 static activation scale) or None (per-token dynamic activations)."""

    def __init__(self, scheme: Fp8Scheme = ONLINE, prefix: str = ""):
        self.scheme = scheme
        self.prefix = prefix
        self.gemm = None
        # The platform's decode kernels (``register_kernels`` ops fp8_*), bound with the product; None: none.
        self.decode_gemm = self.silu_mul_gemm = self.residual_gemm = None

    def create_weights(self, layer: nn.Module, *, input_size: int, output_sizes: list[int],
                       dtype: torch.dtype) -> None:
        """Register the checkpoint-format parameters (see the module docstring).

        Raises:
            ValueError: a block-scaled layer whose tensor-parallel slices cut a weight block.
        """
        s, n, shards = self.scheme, sum(output_sizes), len(output_sizes)
        dims = {"output_dim": 0, "input_dim": 1}
        if not s.serialized:
            layer.register_parameter("weight", _param(torch.empty(n, input_size, dtype=dtype), dims))
            layer.input_scale = None
            return
        layer.register_parameter("weight", _param(torch.empty(n, input_size, dtype=FP8_DTYPE), dims))
        if s.weight_strategy == "tensor":
            scale = _param(torch.empty(shards, dtype=torch.float32), {"output_dim": None})
        elif s.weight_strategy == "channel":
            scale = _param(torch.empty(n, 1, dtype=torch.float32), {"output_dim": 0})
        else:
            bn, bk = s.block
            self._check_blocks(layer, input_size, output_sizes)
            rows, cols = sum(-(-size // bn) for size in output_sizes), -(-input_size // bk)
            scale = _param(torch.empty(rows, cols, dtype=torch.float32),
                           {"output_dim": 0, "pack_factor": bn, "input_dim": 1})
        layer.register_parameter(s.scale_name, scale)
        if s.static_input:
            layer.register_parameter("input_scale", _param(torch.empty(shards, dtype=torch.float32),
                                                           {"output_dim": None}))
        else:
            layer.input_scale = None

    def _check_blocks(self, layer: nn.Module, input_size: int, output_sizes: list[int]) -> None:
        """Refuse, in one line, a block-scaled layer whose shards (or tensor-parallel slices) cut a weight block:
        a merged layer's shard rows, a column-parallel rank's rows, a row-parallel rank's columns."""
        bn, bk = self.scheme.block
        tp = getattr(layer, "tp_size", 1)
        _, full = input_split(layer, input_size)
        column_split = tp > 1 and full == input_size
        if column_split and any(size % bn for size in output_sizes):
            raise ValueError(f"FP8 layer {self.prefix}: block-scaled shards of out_features {output_sizes} (this "
                             f"rank's slices under -tp {tp}) are not multiples of the weight block's {bn} rows")
        if full != input_size and input_size % bk:
            raise ValueError(f"FP8 layer {self.prefix}: -tp {full // input_size} splits its {full} input columns "
                             f"into {input_size} per rank, which the weight block's {bk} columns do not divide; "
                             "use a -tp whose slice is a multiple of the block, or -tp 1")

    def _check_scale(self, name: str, scale: torch.Tensor) -> None:
        bad = ~(torch.isfinite(scale) & (scale > 0))
        if bool(bad.any()):
            value = scale[bad].flatten()[0].item()
            raise ValueError(f"FP8 layer {self.prefix}: {name} has {int(bad.sum())} value(s) that are not finite and "
                             f"positive (e.g. {value}); FP8 scales must be > 0 and finite: the checkpoint is damaged "
                             "or was not written for FP8")

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Bring the weight to FP8 with per-output-channel scales (idempotent) and pick the product for its device.

        Raises:
            ValueError (one line, naming the layer): a weight or input scale that is NaN, infinite, zero or negative.
        """
        if self.gemm is not None:
            return
        s = self.scheme
        weight = layer.weight.data
        if not s.serialized:
            qweight, scale = quantize_fp8_per_channel(weight)
        else:
            raw = getattr(layer, s.scale_name).data
            self._check_scale(s.scale_name, raw)
            if s.weight_strategy == "tensor":
                sizes = torch.tensor(layer.output_sizes, device=raw.device)
                qweight, scale = weight, raw.float().repeat_interleave(sizes)
            elif s.weight_strategy == "channel":
                qweight, scale = weight, raw.float().reshape(-1)
            else:  # block scales: as the checkpoint has them, or one row per output row for ragged shards
                qweight, scale = weight, _block_scale_rows(raw.float(), layer.output_sizes, s.block[0])
            delattr(layer, s.scale_name)
        layer.weight = nn.Parameter(qweight, requires_grad=False)
        layer.register_parameter("weight_scale", nn.Parameter(scale.contiguous(), requires_grad=False))
        if s.static_input:
            self._check_scale("input_scale", layer.input_scale.data)
            layer.input_scale = nn.Parameter(layer.input_scale.data.max().reshape(1), requires_grad=False)
        from brigade_fp8.gemm import cuda_fp8_supported, fp8_block_gemm, fp8_gemm_for

        if s.weight_strategy == "block":
            # ragged merged shards: _block_scale_rows gave one scale row per output row
            block = (1, s.block[1]) if _ragged(layer.output_sizes, s.block[0]) else s.block
            self.gemm = lambda x, w, ws, _, bias: fp8_block_gemm(x, w, ws, block, bias)
            return
        device = qweight.device
        self.gemm = fp8_gemm_for(device, layer.input_size, layer.output_size)
        if device.type != "cuda" or cuda_fp8_supported(device):  # Triton loads e4m3 from compute capability 8.9
            self.decode_gemm = kernel_for("fp8_gemm", device.type)
            self.silu_mul_gemm = kernel_for("fp8_silu_mul_gemm", device.type)
            self.residual_gemm = kernel_for("fp8_residual_gemm", device.type)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Args: x [T, input_size] in the model dtype. Returns [T, sum(output_sizes)] in x's dtype: the platform's
        decode kernel where it takes x (few rows, on CUDA), else the W8A8 product."""
        if self.decode_gemm is not None:
            out = self.decode_gemm(x, layer.weight, layer.weight_scale, bias)
            if out is not None:
                return out
        return self.gemm(x, layer.weight, layer.weight_scale, layer.input_scale, bias)

    def apply_silu_mul(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None, *,
                       residual: torch.Tensor | None = None) -> torch.Tensor | None:
        """The decode kernel with SiLU-and-mul computed from x (gate then up) as it loads it, or None (see
        ``LinearMethod.apply_silu_mul``)."""
        if self.silu_mul_gemm is None:
            return None
        return self.silu_mul_gemm(x, layer.weight, layer.weight_scale, bias, residual=residual)

    def apply_residual(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                       residual: torch.Tensor) -> torch.Tensor | None:
        """The decode kernel with the residual add in its epilogue, or None (see ``LinearMethod.apply_residual``)."""
        if self.residual_gemm is None:
            return None
        return self.residual_gemm(x, layer.weight, layer.weight_scale, bias, residual)
