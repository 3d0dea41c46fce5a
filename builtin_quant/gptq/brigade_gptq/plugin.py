"""brigade-gptq's plugin module (entry point ``gptq`` in ``brigade.general_plugins``).

Registers the method as a lazy ``"module:Attr"`` string so that loading the plugin imports no torch code
(and never Triton: the kernel module is imported only when a layer is built on a CUDA device).
"""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.0"


@hookimpl
def register_quantization_methods(register) -> None:
    register("gptq", "brigade_gptq.config:GPTQConfig")
