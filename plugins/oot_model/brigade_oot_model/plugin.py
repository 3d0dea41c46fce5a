"""brigade-oot-model's plugin module (entry point ``oot_model`` in ``brigade.general_plugins``)."""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.x"


@hookimpl
def register_models(register) -> None:
    # A lazy "module:Attr" path: torch and the model code load only in processes that build the model.
    register("OlmoForCausalLM", "brigade_oot_model.olmo:OlmoForCausalLM")
