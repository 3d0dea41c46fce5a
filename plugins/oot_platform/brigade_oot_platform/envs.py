"""brigade-oot-platform's environment variable, declared once and read by the detector when it runs."""

from __future__ import annotations

from brigade.envs import EnvVar, declare, lazy_getattr

VARIABLES = declare(
    EnvVar("BRIGADE_OOT_DEVICE", "str", None, "1: the example out-of-tree platform's pretend device is present."),
)

__getattr__ = lazy_getattr(VARIABLES)
