"""brigade-fp8's plugin module (entry point ``fp8`` in ``brigade.general_plugins``).

Registers the method as a lazy ``"module:Attr"`` string so that loading the plugin imports no torch code.
"""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.0"


@hookimpl
def register_quantization_methods(register) -> None:
    register("fp8", "brigade_fp8.config:Fp8Config")
