"""Entry point ``reset_prefix_cache`` in ``brigade.endpoint_plugins`` (enable it with
``BRIGADE_ENDPOINT_PLUGINS=reset_prefix_cache``)."""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.x"


@hookimpl
def register_endpoints(register) -> None:
    register("reset_prefix_cache", "brigade_reset_cache_endpoint.router:make_router", required_tasks=("generate",))
