"""Every ``BRIGADE_*`` environment variable of the core distribution, declared once with its type, default and
meaning, and read when used (vLLM's ``envs.py`` pattern).

``brigade.envs.BRIGADE_LOGGING_LEVEL`` reads the variable at that moment (a module ``__getattr__``); nothing is
read at import. Plugin distributions declare theirs the same way in their own ``envs.py`` (``brigade_cuda.envs``
...) with ``EnvVar``, ``declare`` and ``lazy_getattr``. docs/environment.md lists them all; a test checks that
every variable the sources mention is declared in one of these modules and listed there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class EnvVar:
    """One variable: ``type`` is "str", "int", "float", "bool" or "names" (comma-separated); ``default`` is
    the value when the variable is unset (or, except for "str" and "names", empty)."""

    name: str
    type: str
    default: Any
    doc: str

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's text, or None when unset."""
        return (os.environ if environ is None else environ).get(self.name)

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        return self.raw(environ) is not None

    def get(self, environ: Mapping[str, str] | None = None) -> Any:
        """The parsed value (the default when unset).

        Raises:
            ValueError: the text is not of the declared type; the message names the variable.
        """
        raw = self.raw(environ)
        if raw is None or (raw.strip() == "" and self.type not in ("str", "names")):
            return self.default
        if self.type == "names":
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if self.type == "bool":
            value = raw.strip().lower()
            if value in TRUE or value in FALSE:
                return value in TRUE
            raise ValueError(f"{self.name}={raw!r} is not a boolean; use 1 or 0")
        if self.type in ("int", "float"):
            try:
                return int(raw) if self.type == "int" else float(raw)
            except ValueError:
                raise ValueError(f"{self.name}={raw!r} is not a number ({self.type})") from None
        return raw


def declare(*variables: EnvVar) -> dict[str, EnvVar]:
    """{name: variable}; raises ValueError for a name declared twice or not starting with ``BRIGADE_``."""
    table: dict[str, EnvVar] = {}
    for var in variables:
        if not var.name.startswith("BRIGADE_") or var.name in table:
            raise ValueError(f"bad or repeated environment variable declaration {var.name!r}")
        table[var.name] = var
    return table


def lazy_getattr(table: Mapping[str, EnvVar]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that reads ``table``'s variables when they are accessed."""

    def __getattr__(name: str) -> Any:
        if name in table:
            return table[name].get()
        raise AttributeError(f"no environment variable {name!r} is declared here")

    return __getattr__


VARIABLES = declare(
    EnvVar("BRIGADE_PLUGINS", "names", None,
           "Comma-separated allowlist of plugin names to load (all groups but endpoint plugins). Unset loads every "
           "installed plugin; empty loads none (the core's builtin plugin always loads)."),
    EnvVar("BRIGADE_ENDPOINT_PLUGINS", "names", None,
           "Comma-separated endpoint plugins to enable. Unset or empty enables none (unset also warns once when "
           "some are installed)."),
    EnvVar("BRIGADE_PLATFORM", "str", None,
           "Platform name to use instead of detection's choice; its detector must still find its hardware."),
    EnvVar("BRIGADE_PLUGINS_STRICT", "bool", False, "1: any plugin failure aborts start-up instead of a warning."),
    EnvVar("BRIGADE_LOGGING_LEVEL", "str", "INFO", "Log level of the CLI, engine-core and worker processes."),
    EnvVar("BRIGADE_CACHE_DIR", "str", None,
           "Cache directory (the compiled CPU attention kernels); default ~/.cache/brigade."),
    EnvVar("BRIGADE_ENGINE_STARTUP_TIMEOUT", "float", 600.0,
           "Seconds the front end waits for the engine-core process to report ready."),
    EnvVar("BRIGADE_WORKER_MULTIPROC_METHOD", "str", "spawn", "How worker processes start: spawn or fork."),
    EnvVar("BRIGADE_DISTRIBUTED_TIMEOUT", "float", 600.0,
           "Seconds a collective between worker ranks may stall (a rank stopped or stuck) before it fails the engine "
           "with an error instead of hanging."),
    EnvVar("BRIGADE_API_KEY", "str", None,
           "Bearer key: brigade serve requires it on /v1 unless --api-key is given; chat and bench send it."),
    EnvVar("BRIGADE_LOG_STATS_INTERVAL", "float", 10.0,
           "Seconds between the server's periodic stat-logger calls (a positive number)."),
    EnvVar("BRIGADE_ALLOW_RUNTIME_LORA_UPDATING", "bool", False,
           "1: /v1/load_lora_adapter and /v1/unload_lora_adapter are mounted (with --enable-lora)."),
    EnvVar("BRIGADE_KEEP_ALIVE_ON_ENGINE_DEATH", "bool", False,
           "1: the server stays up answering 503 after the engine dies, instead of exiting."),
    EnvVar("BRIGADE_PYTHON", "str", "python3", "scripts/setup.sh: the interpreter that makes the virtual env."),
    EnvVar("BRIGADE_ALLOW_CUDA_TORCH", "bool", False,
           "scripts/setup.sh: 1 accepts a CUDA build of torch where a CPU build was expected."),
)

__getattr__ = lazy_getattr(VARIABLES)
