"""brigade-rocm's plugin module (entry point ``rocm`` in ``brigade.platform_plugins``)."""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.x"


@hookimpl
def register_platforms(register) -> None:
    register("rocm", "brigade_rocm.platform:detect_rocm")
