"""Fp8Config: the ``fp8`` quantization method, online or from a ``quant_method: "fp8"`` checkpoint.

* ``--quantization fp8`` (or ``LLM(..., quantization="fp8")``) on an unquantized checkpoint quantizes the weights
  at load, per output channel, like vLLM's online FP8 mode; activations are quantized per token.
* A checkpoint whose ``config.json`` has ``quantization_config.quant_method == "fp8"`` (vLLM's and transformers'
  ``FP8`` format, DeepSeek-V3 and Qwen3-FP8) is chosen without a flag: ``weight_block_size: [128, 128]`` means
  block scales ``weight_scale_inv``, its absence a per-tensor ``weight_scale``; ``activation_scheme: "static"``
  adds a per-tensor ``input_scale`` (refused with block scales, which only come with dynamic activations).

Only the transformer's linear layers (qkv, o, gate_up, down) are quantized: embeddings and ``lm_head`` are not
linear layers of the ``LinearMethod`` seam and stay in the model dtype, which also keeps the logits' precision.
In mixture-of-experts models the routed experts are quantized too, online only (``Fp8MoEMethod``: per expert and
output channel, W8A16); the router gate and the shared expert's sigmoid gate stay in the model dtype.
Layers named in ``ignored_layers`` (or ``modules_to_not_convert``) stay unquantized; a merged layer is ignored when
all the projections it holds are, and refused when only some are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from brigade.model_executor.layers.linear_method import LinearMethod, MoEMethod, QuantizationConfig

from brigade_fp8.method import ONLINE, Fp8LinearMethod, Fp8Scheme
from brigade_fp8.moe_method import Fp8MoEMethod

# The merged layers of Brigade's models and the HF projections each one holds (the models'
# ``packed_modules_mapping``), so that ignore lists written with HF names match them.
PACKED_MODULES = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def hf_names(prefix: str) -> list[str]:
    """The HF module names a Brigade layer ``prefix`` holds (``...qkv_proj`` -> its q, k and v projections)."""
    parent, _, leaf = prefix.rpartition(".")
    parts = PACKED_MODULES.get(leaf)
    if parts is None:
        return [prefix]
    return [f"{parent}.{p}" if parent else p for p in parts]


def is_ignored(prefix: str, matches: Callable[[str], bool], method: str) -> bool:
    """True when every HF projection of ``prefix`` is ignored (``matches``), False when none is.

    Raises:
        ValueError: only some projections of a merged layer are ignored (one matrix cannot be half quantized).
    """
    names = hf_names(prefix)
    hits = [matches(n) for n in names]
    if all(hits):
        return True
    if any(hits):
        raise ValueError(f"{method}: the checkpoint leaves {[n for n, h in zip(names, hits) if h]} unquantized but "
                         f"quantizes {[n for n, h in zip(names, hits) if not h]}; Brigade merges them into one "
                         f"layer ({prefix}), which must be all FP8 or all unquantized")
    return False


def quantization_config_dict(hf_config: Any) -> dict | None:
    """The checkpoint's ``quantization_config`` as a dict, or None."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is not None and not isinstance(qc, dict):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else vars(qc)
    return qc or None


class Fp8Config(QuantizationConfig):
    """Online FP8, or a ``quant_method: "fp8"`` checkpoint's scheme; ``ignored_layers`` lists HF module names (or
    their suffixes) left unquantized."""

    name = "fp8"

    def __init__(self, scheme: Fp8Scheme = ONLINE, ignored_layers: Iterable[str] = ()):
        self.scheme = scheme
        self.ignored_layers = tuple(ignored_layers)

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> Fp8Config:
        """Online for an unquantized checkpoint, else the scheme of its ``quant_method: "fp8"`` config.

        Raises:
            ValueError (one line): a checkpoint of another method (compressed-tensors FP8 is chosen by its own
                ``quant_method``), an fp8 config with an unsupported ``fmt``, ``activation_scheme`` or
                ``weight_block_size``.
        """
        qc = quantization_config_dict(hf_config)
        if qc is None:
            return cls()
        method = str(qc.get("quant_method", "")).lower()
        if method != "fp8":
            raise ValueError(f"--quantization fp8 quantizes unquantized checkpoints online or loads quant_method "
                             f"'fp8' checkpoints, but this checkpoint is quantized with quant_method {method!r}; drop "
                             "--quantization to use the checkpoint's own method")
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ValueError(f"FP8 checkpoint with fmt {fmt!r} is not supported; brigade-fp8 loads e4m3 weights")
        activation = qc.get("activation_scheme", "dynamic")
        if activation not in ("dynamic", "static"):
            raise ValueError(f"FP8 checkpoint with activation_scheme {activation!r} is not supported; expected "
                             "'dynamic' or 'static'")
        block = qc.get("weight_block_size")
        if block is None:
            scheme = Fp8Scheme(serialized=True, weight_strategy="tensor", static_input=activation == "static")
        else:
            if (not isinstance(block, (list, tuple)) or len(block) != 2
                    or not all(isinstance(b, int) and b > 0 for b in block)):
                raise ValueError(f"FP8 checkpoint with weight_block_size {block!r} is not supported; expected two "
                                 "positive integers such as [128, 128]")
            if activation == "static":
                raise ValueError("FP8 checkpoint with weight_block_size and activation_scheme 'static' is not "
                                 "supported; block-scaled FP8 runs with dynamic activations")
            scheme = Fp8Scheme(serialized=True, weight_strategy="block", block=(block[0], block[1]),
                               scale_name="weight_scale_inv")
        ignored = qc.get("ignored_layers") or qc.get("modules_to_not_convert") or ()
        return cls(scheme, ignored)

    def _ignores(self, name: str) -> bool:
        """Whether ``name`` is, or ends with, an entry of ``ignored_layers``."""
        return any(name == ig or name.endswith("." + ig) for ig in self.ignored_layers)

    def get_linear_method(self, prefix: str) -> LinearMethod | None:
        """``Fp8LinearMethod`` for every linear layer except those matching ``ignored_layers``."""
        if is_ignored(prefix, self._ignores, "FP8 checkpoint"):
            return None
        return Fp8LinearMethod(self.scheme, prefix)

    def get_moe_method(self, prefix: str) -> MoEMethod | None:
        """``Fp8MoEMethod`` for online FP8; None for a serialized checkpoint (its experts' FP8 tensors have no
        loader: the MoE models refuse quantized checkpoints first) and for experts in ``ignored_layers``."""
        if self.scheme.serialized or self._ignores(prefix):
            return None
        return Fp8MoEMethod()
