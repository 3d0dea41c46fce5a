"""Entry point ``structured_text`` in ``brigade.io_processor_plugins``."""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.x"


@hookimpl
def register_io_processors(register) -> None:
    register("structured_text", "brigade_io_processor_example.processor:StructuredTextProcessor")
