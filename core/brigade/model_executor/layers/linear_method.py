"""LinearMethod and QuantizationConfig: the seam through which quantization plugins change linear layers (book ch. 11).

A linear layer does not own its weight format. It asks its ``LinearMethod`` to create the parameters
(``create_weights``), to finish them once the checkpoint is read (``process_weights_after_loading``:
repacking, transposing, computing scales) and to compute the product (``apply``). The default,
``UnquantizedLinearMethod``, keeps one ``[out_features, in_features]`` weight in the model dtype.

A quantization plugin registers a ``QuantizationConfig`` subclass under its method name
(``register_quantization_methods``). The loader builds it with ``from_hf_config`` and the model hands
it to every linear layer, which calls ``get_linear_method(prefix)``. Parameters a method creates must
carry the attributes listed in ``weight_utils`` (``output_dim``, ``pack_factor``) so the merged
layers' weight loaders can place each checkpoint shard; their names are the checkpoint's names
relative to the layer (``weight``, ``weight_scale``, ``qzeros``...), so HF names map onto them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from brigade.model_executor.weight_utils import set_weight_attrs


class LinearMethod(ABC):
    """How one linear layer stores its weight and computes ``x @ W.T + b``."""

    @abstractmethod
    def create_weights(self, layer: nn.Module, *, input_size: int, output_sizes: list[int],
                       dtype: torch.dtype) -> None:
        """Register the layer's parameters on ``layer`` (on the default device).

        Args:
            layer: the linear layer; set attributes with ``layer.register_parameter``.
            input_size: in_features.
            output_sizes: out_features of each merged shard (one entry for a plain linear layer);
                the merged output is their concatenation in this order.
            dtype: the model dtype (activations).
        """

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Args: x [num_tokens, input_size] in the model dtype. Returns [num_tokens, sum(output_sizes)]."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Turn checkpoint-format parameters into kernel format; called once after all weights are loaded."""

    def apply_silu_mul(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
        """``silu(x[:, :K]) * x[:, K:] @ W.T + b`` in one kernel, or None when this method has none for ``x``.

        Args: x [num_tokens, 2 * input_size] (gate then up). The caller falls back to SiLU-and-mul then
        ``apply`` on None, which is the default.
        """
        return None


DenseGemm = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
# (gate_up [T, 2K], weight [N, K], bias) -> [T, N], or None for a shape the kernel does not take
SiluMulGemm = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], "torch.Tensor | None"]
_DENSE_GEMMS: dict[str, DenseGemm] = {}
_SILU_MUL_GEMMS: dict[str, SiluMulGemm] = {}


def register_dense_gemm(device_type: str, gemm: DenseGemm, *, silu_mul_gemm: SiluMulGemm | None = None) -> None:
    """Use ``gemm(x, weight, bias)`` instead of ``F.linear`` for dense weights built on ``device_type``.

    Same contract as ``F.linear`` (x [T, K], weight [N, K], bias [N] or None -> [T, N]); a platform uses it
    for shapes its own kernels do better (the CUDA platform: few-token decode). Like ``CustomOp``, each layer
    binds at construction, in the process that builds the model, before ``load_model``.

    ``silu_mul_gemm(x, weight, bias)``, optional, computes ``silu(x[:, :K]) * x[:, K:]`` as the product's
    input inside the GEMM (the SwiGLU down projection without its activation kernel) and returns None for
    shapes it does not take; ``LinearMethod.apply_silu_mul`` reaches it.

    Raises ValueError when ``device_type`` already has a different function.
    """
    tables = ((_DENSE_GEMMS, gemm, "dense GEMM"), (_SILU_MUL_GEMMS, silu_mul_gemm, "SiLU-mul GEMM"))
    for table, fn, what in tables:
        existing = table.get(device_type)
        if fn is not None and existing is not None and existing is not fn:
            raise ValueError(f"a {what} is already registered for {device_type} "
                             f"({existing.__module__}.{existing.__qualname__})")
    for table, fn, _ in tables:
        if fn is not None:
            table[device_type] = fn


def unregister_dense_gemm(device_type: str) -> None:
    """Forget the functions for ``device_type`` (layers built afterwards use ``F.linear``)."""
    for table in (_DENSE_GEMMS, _SILU_MUL_GEMMS):
        table.pop(device_type, None)


def dense_gemm_for_default_device() -> DenseGemm:
    """The function registered for ``torch.get_default_device()``'s type, else ``F.linear``."""
    return _DENSE_GEMMS.get(torch.get_default_device().type, F.linear)


class UnquantizedLinearMethod(LinearMethod):
    """A dense ``[sum(output_sizes), input_size]`` weight in the model dtype, applied with ``F.linear`` or the
    platform's registered dense GEMM (``register_dense_gemm``)."""

    def create_weights(self, layer: nn.Module, *, input_size: int, output_sizes: list[int],
                       dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=dtype), requires_grad=False)
        set_weight_attrs(weight, {"output_dim": 0})
        layer.register_parameter("weight", weight)
        self.gemm = dense_gemm_for_default_device()
        self.silu_mul_gemm = _SILU_MUL_GEMMS.get(torch.get_default_device().type)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.gemm(x, layer.weight, bias)

    def apply_silu_mul(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
        return None if self.silu_mul_gemm is None else self.silu_mul_gemm(x, layer.weight, bias)


class QuantizationConfig(ABC):
    """A quantization method's settings for one model; plugins subclass it and register the class."""

    name: str = "unspecified"

    @classmethod
    @abstractmethod
    def from_hf_config(cls, hf_config: Any) -> QuantizationConfig:
        """Build from the model's HF config (its ``quantization_config`` dict, when the checkpoint has one).

        Raises ValueError when the checkpoint cannot be run with this method.
        """

    @abstractmethod
    def get_linear_method(self, prefix: str) -> LinearMethod | None:
        """The method for the linear layer named ``prefix`` (e.g. ``model.layers.0.mlp.down_proj``).

        Merged layers are named by their merged module (``...self_attn.qkv_proj``,
        ``...mlp.gate_up_proj``); the model class's ``packed_modules_mapping`` lists the HF
        projections each one holds. Returns None to leave that layer unquantized.
        """


def get_linear_method(quant_config: QuantizationConfig | None, prefix: str) -> LinearMethod:
    """The quantization config's method for ``prefix``, falling back to ``UnquantizedLinearMethod``."""
    if quant_config is None:
        return UnquantizedLinearMethod()
    return quant_config.get_linear_method(prefix) or UnquantizedLinearMethod()
