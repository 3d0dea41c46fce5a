"""brigade-oot-platform's plugin module (entry point ``oot`` in ``brigade.platform_plugins``)."""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.x"


@hookimpl
def register_platforms(register) -> None:
    register("oot", "brigade_oot_platform.platform:detect_oot")


@hookimpl
def register_attention_backends(register) -> None:
    register("oot", "brigade_oot_platform.attention:OotAttentionBackend")
