"""brigade-nixl's plugin module (entry point ``nixl`` in ``brigade.general_plugins``).

Registers the connector as a lazy ``"module:Attr"`` string, so loading the plugin imports neither torch, ZeroMQ
nor NIXL; the connector module is imported when an engine is configured with it.
"""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.0"


@hookimpl
def register_kv_connectors(register) -> None:
    register("NixlConnector", "brigade_nixl.connector:NixlConnector")
