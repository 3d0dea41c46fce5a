"""Fp8Config: the ``fp8`` quantization method's settings, registered under that name.

Selected with ``--quantization fp8`` (or ``LLM(..., quantization="fp8")``) on an unquantized
checkpoint, like vLLM's online FP8 mode. Only the transformer's linear layers (qkv, o, gate_up,
down) are quantized: embeddings and ``lm_head`` are not linear layers of the ``LinearMethod`` seam
and stay in the model dtype, which also keeps the logits' precision.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from brigade.model_executor.layers.linear_method import LinearMethod, QuantizationConfig

from brigade_fp8.method import Fp8LinearMethod


class Fp8Config(QuantizationConfig):
    """Online FP8 weight quantization; ``ignored_layers`` lists prefixes (or their suffixes) left unquantized."""

    name = "fp8"

    def __init__(self, ignored_layers: Iterable[str] = ()):
        self.ignored_layers = tuple(ignored_layers)

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> Fp8Config:
        """Build for an unquantized checkpoint.

        Raises:
            ValueError: the checkpoint is already quantized (its config has a ``quantization_config``);
                serialized FP8 checkpoints (with stored ``weight_scale`` tensors) are not supported yet.
        """
        checkpoint_quant = getattr(hf_config, "quantization_config", None)
        if checkpoint_quant:
            method = (checkpoint_quant.get("quant_method") if isinstance(checkpoint_quant, dict)
                      else getattr(checkpoint_quant, "quant_method", None))
            raise ValueError(f"--quantization fp8 quantizes unquantized checkpoints online, but this checkpoint "
                             f"is already quantized (quant_method={method!r}); loading serialized FP8 "
                             "checkpoints is not supported by brigade-fp8 yet")
        return cls()

    def get_linear_method(self, prefix: str) -> LinearMethod | None:
        """``Fp8LinearMethod`` for every linear layer except those matching ``ignored_layers``."""
        if any(prefix == name or prefix.endswith("." + name) for name in self.ignored_layers):
            return None
        return Fp8LinearMethod()
