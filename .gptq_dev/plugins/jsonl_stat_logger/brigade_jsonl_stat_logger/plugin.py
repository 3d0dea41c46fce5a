"""Entry point ``jsonl`` in ``brigade.stat_logger_plugins``."""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.x"


@hookimpl
def register_stat_loggers(register) -> None:
    register("jsonl", "brigade_jsonl_stat_logger.logger:JsonlStatLogger")
