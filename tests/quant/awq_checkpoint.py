"""Make AWQ-format (AutoAWQ GEMM) checkpoints of a real HF model for the brigade-awq tests, with no AutoAWQ.

``quantize_awq`` is AutoAWQ's ``pseudo_quantize_tensor`` with ``zero_point=True`` (per group of ``group_size``
input rows: ``scale = (max - min).clamp(min=1e-5) / 15``, ``zero = clamp(-round(min / scale), 0, 15)``,
``q = clamp(round(w / scale) + zero, 0, 15)``), without AWQ's activation-aware search, which changes which
codes are chosen but not the format; scales are stored in float16 and the codes computed against them.

``autoawq_pack`` follows AutoAWQ's ``WQLinear_GEMM.from_linear``: numpy uint32 words, a loop over word columns
and over the 8 nibbles, nibble ``i`` taking column ``AWQ_ORDER[i] = [0, 2, 4, 6, 1, 3, 5, 7][i]`` of its 8; it
is independent of ``brigade_awq.packing``. The same codes, zeros and fp16 scales, dequantized in float32, go
into an ordinary checkpoint (``gptq_checkpoint.write_dequantized_checkpoint``, which takes any layer with
``dequantized()``) that HF transformers runs as the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gptq_checkpoint import PROJECTIONS, _read_checkpoint, write_packed_checkpoint

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


@dataclass
class AWQLinear:
    """One layer's AWQ quantization. q [in, out] uint8 codes; zeros [groups, out] int64; scales [groups, out]
    float16."""

    q: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor

    def dequantized(self) -> torch.Tensor:
        """[out, in] float32: ``(q - zero) * scale`` per row's group."""
        k, n = self.q.shape
        groups = self.zeros.shape[0]
        diff = self.q.to(torch.int32).view(groups, k // groups, n) - self.zeros.to(torch.int32)[:, None, :]
        return (diff.float() * self.scales.float()[:, None, :]).view(k, n).T.contiguous()


def quantize_awq(weight: torch.Tensor, group_size: int) -> AWQLinear:
    """Round-to-nearest AWQ quantization (zero_point) of ``weight`` [out, in]; ``in`` a multiple of group_size."""
    w = weight.float().T.contiguous()  # [in, out]
    k, n = w.shape
    g = w.view(k // group_size, group_size, n)
    wmax, wmin = g.amax(1), g.amin(1)  # [groups, out]
    scales = ((wmax - wmin).clamp(min=1e-5) / 15).half()
    s = scales.float()
    zeros = torch.clamp(-torch.round(wmin / s), 0, 15).to(torch.int64)
    codes = g / s[:, None]  # one temporary, then in place
    codes.round_().add_(zeros[:, None].float()).clamp_(0, 15)
    q = codes.to(torch.uint8).view(k, n)
    return AWQLinear(q=q, zeros=zeros, scales=scales)


def _pack_awq_words(values: np.ndarray) -> np.ndarray:
    """[rows, out] uint32 codes -> [rows, out / 8] words, AutoAWQ's loop."""
    words = np.zeros((values.shape[0], values.shape[1] // 8), dtype=np.uint32)
    for col in range(words.shape[1]):
        for i in range(8):
            words[:, col] |= values[:, col * 8 + AWQ_ORDER[i]] << np.uint32(i * 4)
    return words


def autoawq_pack(layer: AWQLinear) -> dict[str, torch.Tensor]:
    """``qweight``, ``qzeros``, ``scales`` as AutoAWQ's GEMM layer stores them."""
    qweight = _pack_awq_words(layer.q.numpy().astype(np.uint32))
    qzeros = _pack_awq_words(layer.zeros.numpy().astype(np.uint32))
    return {"qweight": torch.from_numpy(qweight.view(np.int32).copy()),
            "qzeros": torch.from_numpy(qzeros.view(np.int32).copy()),
            "scales": layer.scales.clone()}


def awq_quantization_config(group_size: int, modules_to_not_convert: list[str] | None = None) -> dict:
    """config.json's ``quantization_config`` as AutoAWQ / transformers write it."""
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": modules_to_not_convert}


def quantize_model(model_dir: Path, group_size: int) -> tuple[dict, dict[str, AWQLinear]]:
    """Read ``model_dir`` and quantize its projections. Returns (all original tensors, {projection: layer})."""
    tensors = _read_checkpoint(model_dir)
    layers = {}
    for name in sorted(tensors):
        prefix, _, leaf = name.rpartition(".")
        if leaf == "weight" and any(prefix.endswith(p) for p in PROJECTIONS):
            layers[prefix] = quantize_awq(tensors[name], group_size)
    return tensors, layers


def write_awq_checkpoint(model_dir: Path, out_dir: Path, group_size: int,
                         layers: tuple[dict, dict[str, AWQLinear]]) -> Path:
    """Write an AWQ checkpoint: packed projections, the rest as it was, config.json with quantization_config."""
    tensors, quantized = layers
    return write_packed_checkpoint(model_dir, out_dir, tensors, {p: autoawq_pack(q) for p, q in quantized.items()},
                                   awq_quantization_config(group_size))


# SmolLM2-135M: in_features 576 and 1536, both multiples of 64 (576 is not one of 128).
E2E_GROUP_SIZE = 64
