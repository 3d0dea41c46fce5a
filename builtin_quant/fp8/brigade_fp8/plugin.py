"""brigade-fp8's plugin module (entry point ``fp8`` in ``brigade.general_plugins``).

Registers the methods as lazy ``"module:Attr"`` strings so that loading the plugin imports no torch code: ``fp8``
(online, and ``quant_method: "fp8"`` checkpoints) and ``compressed-tensors`` (its FP8 schemes).
"""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.0"


@hookimpl
def register_quantization_methods(register) -> None:
    register("fp8", "brigade_fp8.config:Fp8Config")
    register("compressed-tensors", "brigade_fp8.compressed_tensors_config:CompressedTensorsFp8Config")
