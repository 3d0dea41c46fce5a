"""AWQLinearMethod: a linear layer that keeps an AWQ checkpoint's packed tensors and multiplies through them.

Parameters (the checkpoint's names, relative to the layer; ``N = sum(output_sizes)``, ``K = input_size``,
``G = K / group_size``; format in ``packing``):

* ``qweight`` int32 [K, N / 8], ``output_dim`` 1, ``pack_factor`` 8: packed along the output dimension, so a
  merged layer's projection lands at ``offset / 8`` and every projection's width must be a multiple of 8.
* ``qzeros`` int32 [G, N / 8], ``output_dim`` 1, ``pack_factor`` 8.
* ``scales`` float16 [G, N], ``output_dim`` 1.

Compute, bound at construction from the default device like brigade-gptq's:

* on CUDA, a Triton GEMM that dequantizes inside its K loop (``brigade_awq.triton_gemm.awq_gemm``: the packed
  words are read once per tile, never written out dequantized; fp32 accumulation; split-K for decode-sized
  batches). ``BRIGADE_AWQ_TRITON=0`` turns it off; a CUDA host where Triton is not importable logs one WARNING
  and falls back to the path below.
* elsewhere (CPU), and on CUDA without the kernel, the portable PyTorch path: each forward dequantizes the layer
  to the activation dtype, a column block of at most ``packing.DEQUANT_CHUNK_BYTES`` at a time, multiplies, and
  drops it.

Either way nothing dequantized outlives the call, so the weights stay at a quarter of their fp16 size in memory.
Tensor parallelism (vLLM's AWQ sharding): a column-parallel layer (qkv, gate_up) holds its packed output words
of ``qweight``/``qzeros`` and its ``scales`` columns (each projection's slice must be whole words of 8); a
row-parallel layer (o_proj, down_proj) holds its input rows of ``qweight`` and the ``qzeros``/``scales`` rows of
its groups (``input_dim`` 0), which needs ``group_size`` to divide the rank's rows (refused otherwise).
No fused norm/SiLU/residual variants.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

from brigade.model_executor.layers.linear_method import LinearMethod, input_split
from brigade.model_executor.weight_utils import set_weight_attrs
from brigade_awq import envs

from brigade_awq import packing
from brigade_awq.config import SUPPORTED, AWQConfig

logger = logging.getLogger(__name__)

TRITON_ENV = "BRIGADE_AWQ_TRITON"


@functools.cache
def _load_kernel():
    """``triton_gemm.awq_gemm``, or None (with one WARNING per process) when Triton is not importable."""
    try:
        from brigade_awq.triton_gemm import awq_gemm
    except ImportError as e:
        logger.warning("brigade-awq: Triton is not importable (%s); AWQ layers use the PyTorch dequantize-then-"
                       "matmul path on CUDA (pip install triton for the fused kernel)", e)
        return None
    return awq_gemm


def kernel_for_device(device_type: str):
    """The fused GEMM for layers built on ``device_type`` (``triton_gemm.awq_gemm`` on CUDA), or None for the
    PyTorch path. ``BRIGADE_AWQ_TRITON=0`` forces the PyTorch path; a CUDA host without Triton gets it too, with
    one WARNING."""
    if device_type != "cuda" or not envs.BRIGADE_AWQ_TRITON:
        return None
    return _load_kernel()


class AWQLinearMethod(LinearMethod):
    """One linear layer of an AWQ checkpoint; see the module docstring. ``gemm``: the fused kernel bound at
    ``create_weights`` (None: the PyTorch path)."""

    def __init__(self, config: AWQConfig, prefix: str = ""):
        self.config = config
        self.prefix = prefix
        self.gemm = None  # the fused kernel, bound by create_weights on CUDA

    def _fail(self, what: str) -> ValueError:
        return ValueError(f"AWQ layer {self.prefix or '?'}: {what}; {SUPPORTED}, with every layer's in_features "
                          f"divisible by group_size {self.config.group_size} and each projection's "
                          "out_features by 8")

    def create_weights(self, layer: nn.Module, *, input_size: int, output_sizes: list[int],
                       dtype: torch.dtype) -> None:
        """Register ``qweight``, ``qzeros`` and ``scales`` (see the module docstring).

        Raises:
            ValueError (one line): ``input_size`` is not a multiple of ``group_size``, or one of ``output_sizes``
                is not a multiple of 8, so the checkpoint's packed tensors cannot describe the layer.
        """
        pack, gs = packing.PACK, self.config.group_size
        start, full = input_split(layer, input_size)
        if full != input_size and input_size % gs:
            raise ValueError(f"AWQ layer {self.prefix or '?'}: -tp {full // input_size} splits its {full} input rows "
                             f"into {input_size} per rank, which group_size {gs} does not divide; use a -tp whose "
                             f"slice is a multiple of {gs}, or -tp 1")
        if input_size % gs:
            raise self._fail(f"in_features {input_size} is not a multiple of group_size {gs}")
        bad = [size for size in output_sizes if size % pack]
        if bad:
            raise self._fail(f"out_features {bad[0]} (of {output_sizes}) is not a multiple of {pack}, so its "
                             "qweight/qzeros columns cannot be packed")
        out = sum(output_sizes)
        groups = input_size // gs
        qweight = nn.Parameter(torch.zeros(input_size, out // pack, dtype=torch.int32), requires_grad=False)
        set_weight_attrs(qweight, {"output_dim": 1, "pack_factor": pack, "input_dim": 0})
        qzeros = nn.Parameter(torch.zeros(groups, out // pack, dtype=torch.int32), requires_grad=False)
        set_weight_attrs(qzeros, {"output_dim": 1, "pack_factor": pack, "input_dim": 0})
        scales = nn.Parameter(torch.zeros(groups, out, dtype=torch.float16), requires_grad=False)
        set_weight_attrs(scales, {"output_dim": 1, "input_dim": 0})
        for name, param in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
            layer.register_parameter(name, param)
        self.gemm = kernel_for_device(torch.get_default_device().type)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Nothing to do: the packed tensors are used as loaded."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Args: x [T, K] in the model dtype. Returns ``x @ W.T (+ bias)`` [T, N] in x's dtype."""
        if self.gemm is not None:
            return self.gemm(x, layer.qweight, layer.qzeros, layer.scales, bias, group_size=self.config.group_size)
        chunks = packing.column_chunks(0, layer.output_size, layer.input_size,
                                        budget_bytes=packing.DEQUANT_CHUNK_BYTES)
        if len(chunks) == 1:
            out = x @ packing.dequantize(layer.qweight, layer.qzeros, layer.scales,
                                         group_size=self.config.group_size, dtype=x.dtype)
        else:
            out = x.new_empty(x.shape[0], layer.output_size)
            for c0, c1 in chunks:
                w = packing.dequantize(layer.qweight, layer.qzeros, layer.scales, group_size=self.config.group_size,
                                       dtype=x.dtype, columns=(c0, c1))
                out[:, c0:c1] = x @ w
                del w
        if bias is not None:
            out = out + bias
        return out
