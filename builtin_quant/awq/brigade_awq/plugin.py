"""brigade-awq's plugin module (entry point ``awq`` in ``brigade.general_plugins``).

Registers the method as a lazy ``"module:Attr"`` string so that loading the plugin imports no torch code.
"""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.0"


@hookimpl
def register_quantization_methods(register) -> None:
    register("awq", "brigade_awq.config:AWQConfig")
