"""LinearMethod and QuantizationConfig: the seam through which quantization plugins change linear layers.

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
from brigade.plugins.kernels import kernel_for


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

    def apply_silu_mul(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None, *,
                       residual: torch.Tensor | None = None) -> torch.Tensor | None:
        """``silu(x[:, :K]) * x[:, K:] @ W.T + b (+ residual)`` in one kernel, or None when this method has
        none for ``x``.

        Args: x [num_tokens, 2 * input_size] (gate then up); residual [num_tokens, output_size] or None. The
        caller falls back to SiLU-and-mul then ``apply_residual`` on None, which is the default.
        """
        return None

    def apply_residual(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                       residual: torch.Tensor) -> torch.Tensor | None:
        """``residual + (x @ W.T + b)`` with the add in the GEMM's epilogue (a pre-norm block's skip
        connection), or None when the method has no such kernel for ``x`` (the default): the caller then
        leaves the add to the next norm's fused add-and-normalize kernel.

        Args: x [T, input_size]; residual [T, output_size] in x's dtype. Returns a new [T, output_size]
        tensor; the product is rounded to x's dtype before the add (HF's order).
        """
        return None

    def apply_rms_norm(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                       eps: float) -> torch.Tensor | None:
        """``(x / sqrt(mean(x**2, -1) + eps)) @ W.T + b`` in one kernel, or None when this method has none.

        Only meaningful after ``fold_input_scale`` took the norm's weight into ``W``. Args: x [T, input_size].
        """
        return None

    def fold_input_scale(self, layer: nn.Module, scale: torch.Tensor) -> bool:
        """Make the weight ``W @ diag(scale)`` so that ``x @ W.T`` becomes ``(x * scale) @ W.T``; returns False
        (and changes nothing) when the method's weight format cannot take it. The default cannot.

        Args: scale [input_size], any float dtype.
        """
        return False


DenseGemm = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
# (gate_up [T, 2K], weight [N, K], bias, *, residual=None) -> [T, N], or None for a shape it does not take
SiluMulGemm = Callable[..., "torch.Tensor | None"]
# (x [T, K], weight [N, K], bias, residual [T, N]) -> residual + x @ W.T + b, or None
ResidualGemm = Callable[..., "torch.Tensor | None"]
# (x [T, K], weight [N, K], bias, eps) -> rms_normalize(x) @ W.T + b, or None
RmsNormGemm = Callable[..., "torch.Tensor | None"]

# A platform replaces ``F.linear`` for dense weights through the ``register_kernels`` hook (ops
# ``brigade.plugins.kernels.KERNEL_OPS``): "dense_gemm" (F.linear's contract; the CUDA platform uses it for
# few-token decode), and the fused variants, which return None for shapes they do not take (the layer then
# runs the unfused ops):
#
# * "silu_mul_gemm" computes ``silu(x[:, :K]) * x[:, K:]`` as the product's input inside the GEMM (the SwiGLU
#   down projection without its activation kernel), adding ``residual`` when given (``apply_silu_mul``);
# * "residual_gemm" returns ``residual + x @ W.T + b``, the skip connection in the epilogue (``apply_residual``);
# * "rms_norm_gemm" returns ``(x / rms(x)) @ W.T + b``, the norm's statistics taken while the GEMM reads ``x``
#   (``apply_rms_norm``). Its presence also makes the loader fold each RMSNorm's weight into the dense
#   projection that follows it (``fold_norms_wanted``), because the kernel leaves the weight multiply to the
#   folded matrix.
#
# Each layer binds at construction, in the process that builds the model.


def input_split(layer: nn.Module, input_size: int) -> tuple[int, int]:
    """``(input_start, full_input_size)`` of a layer whose ``create_weights`` is running: a row-parallel layer
    under ``-tp`` above 1 holds in_features ``[input_start, input_start + input_size)`` of ``full_input_size``
    (``layers.linear.RowParallelLinear``); any other layer holds them all, ``(0, input_size)``.

    A method marks each parameter that follows the input features with ``input_dim`` (the dimension that holds
    them, packed or grouped: its rows split in ``tp`` equal parts), and refuses a layout whose split would cut a
    packed word or a quantization group.
    """
    return getattr(layer, "input_start", 0), getattr(layer, "full_input_size", input_size)


def fold_norms_wanted(device_type: str) -> bool:
    """True when the active platform has an "rms_norm_gemm" for ``device_type``: models built there should
    fold their RMSNorm weights into the following dense projections."""
    return kernel_for("rms_norm_gemm", device_type) is not None


def rms_norm_gemm_for_default_device() -> RmsNormGemm | None:
    """The "rms_norm_gemm" kernel for ``torch.get_default_device()``'s type, or None."""
    return kernel_for("rms_norm_gemm")


def fold_scale_into_weight(weight: torch.Tensor, scale: torch.Tensor) -> None:
    """In place: ``weight[:, k] *= scale[k]``, computed in fp32 and rounded once to the weight's dtype.

    Args: weight [N, K] float; scale [K].
    """
    weight.copy_(weight.float() * scale.float()[None, :])


def dense_gemm_for_default_device() -> DenseGemm:
    """The "dense_gemm" kernel for ``torch.get_default_device()``'s type, else ``F.linear``."""
    return kernel_for("dense_gemm") or F.linear


class UnquantizedLinearMethod(LinearMethod):
    """A dense ``[sum(output_sizes), input_size]`` weight in the model dtype, applied with ``F.linear`` or the
    platform's "dense_gemm" kernel (and its fused variants, when registered)."""

    def create_weights(self, layer: nn.Module, *, input_size: int, output_sizes: list[int],
                       dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=dtype), requires_grad=False)
        set_weight_attrs(weight, {"output_dim": 0, "input_dim": 1})
        layer.register_parameter("weight", weight)
        self.gemm = dense_gemm_for_default_device()
        self.silu_mul_gemm = kernel_for("silu_mul_gemm")
        self.residual_gemm = kernel_for("residual_gemm")
        self.rms_norm_gemm = kernel_for("rms_norm_gemm")

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.gemm(x, layer.weight, bias)

    def apply_silu_mul(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None, *,
                       residual: torch.Tensor | None = None) -> torch.Tensor | None:
        if self.silu_mul_gemm is None:
            return None
        return self.silu_mul_gemm(x, layer.weight, bias, residual=residual)

    def apply_residual(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                       residual: torch.Tensor) -> torch.Tensor | None:
        return None if self.residual_gemm is None else self.residual_gemm(x, layer.weight, bias, residual)

    def apply_rms_norm(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                       eps: float) -> torch.Tensor | None:
        return None if self.rms_norm_gemm is None else self.rms_norm_gemm(x, layer.weight, bias, eps)

    def fold_input_scale(self, layer: nn.Module, scale: torch.Tensor) -> bool:
        fold_scale_into_weight(layer.weight.data, scale)
        return True


class MoEMethod(ABC):
    """How a ``FusedMoE`` layer's stacked expert weights are stored (vLLM's ``FusedMoEMethodBase``, reduced to the
    load step). The layer creates ``w13_weight`` [E, 2I, H] and ``w2_weight`` [E, H, I] in the model dtype and
    the ordinary expert loaders fill them; ``process_weights_after_loading`` may then replace them with FP8
    (``float8_e4m3fn``) tensors of the same shapes and set ``w13_weight_scale`` [E, 2I] and ``w2_weight_scale``
    [E, H] (fp32, one per expert and output channel), so that ``w.float() * scale[..., None]`` is the weight the
    product uses. That is the one quantized layout the fused MoE paths read (``fused_moe.fused_moe_reference``,
    the platforms' ``"fused_moe"`` kernels): activations stay in the model dtype (W8A16)."""

    @abstractmethod
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Turn the loaded model-dtype expert weights into the method's format; called once after loading."""


class QuantizationConfig(ABC):
    """A quantization method's settings for one model; plugins subclass it and register the class."""

    name: str = "unspecified"

    @classmethod
    @abstractmethod
    def from_hf_config(cls, hf_config: Any) -> QuantizationConfig:
        """Build from the model's HF config (its ``quantization_config`` dict, when the checkpoint has one).

        Raises ValueError when the checkpoint cannot be run with this method.
        """

    @classmethod
    def checkpoint_quantization_config(cls, hf_config: Any, *, made_by: str) -> dict:
        """The checkpoint's ``quantization_config`` as a dict, for a method (``cls.name``) that only loads
        checkpoints quantized offline (``made_by``: the tools that make them, for the message).

        Raises:
            ValueError (one line): the checkpoint has no ``quantization_config`` (``--quantization NAME`` on an
                unquantized checkpoint), or one of another ``quant_method``.
        """
        name, upper = cls.name, cls.name.upper()
        a = "an" if upper[:1] in "AEFHILMNORSX" else "a"  # the acronym's first letter as spoken: an AWQ, a GPTQ
        qc = getattr(hf_config, "quantization_config", None)
        if qc is not None and not isinstance(qc, dict):
            qc = qc.to_dict() if hasattr(qc, "to_dict") else vars(qc)
        if not qc:
            raise ValueError(f"--quantization {name} needs {a} {upper} checkpoint (config.json with a "
                             f"quantization_config whose quant_method is '{name}'), but this model has no "
                             f"quantization_config; {upper} is made offline ({made_by}), so serve {a} {upper} "
                             "checkpoint, or drop --quantization (--quantization fp8 quantizes online)")
        if str(qc.get("quant_method", "")).lower() != name:
            raise ValueError(f"--quantization {name} cannot load this checkpoint: its quantization_config has "
                             f"quant_method {qc.get('quant_method')!r}, not '{name}'; drop --quantization to use the "
                             "checkpoint's own method")
        return qc

    @abstractmethod
    def get_linear_method(self, prefix: str) -> LinearMethod | None:
        """The method for the linear layer named ``prefix`` (e.g. ``model.layers.0.mlp.down_proj``).

        Merged layers are named by their merged module (``...self_attn.qkv_proj``,
        ``...mlp.gate_up_proj``); the model class's ``packed_modules_mapping`` lists the HF
        projections each one holds. Returns None to leave that layer unquantized.
        """


    def get_moe_method(self, prefix: str) -> MoEMethod | None:
        """The method for the routed experts named ``prefix`` (``model.layers.0.mlp.experts``), or None when this
        quantization has none: the model then refuses to start, in one line (``SparseMoeBlock``), rather than
        leave most of its weights unquantized. The default has none."""
        return None


def get_linear_method(quant_config: QuantizationConfig | None, prefix: str) -> LinearMethod:
    """The quantization config's method for ``prefix``, falling back to ``UnquantizedLinearMethod``."""
    if quant_config is None:
        return UnquantizedLinearMethod()
    return quant_config.get_linear_method(prefix) or UnquantizedLinearMethod()
