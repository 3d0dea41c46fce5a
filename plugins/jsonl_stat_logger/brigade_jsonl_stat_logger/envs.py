"""brigade-jsonl-stat-logger's environment variable, declared once and read when the logger starts."""

from __future__ import annotations

from brigade.envs import EnvVar, declare, lazy_getattr

VARIABLES = declare(
    EnvVar("BRIGADE_STATS_JSONL", "str", None,
           "File the jsonl stat logger appends one JSON object per engine step to; unset: it writes nothing."),
)

__getattr__ = lazy_getattr(VARIABLES)
