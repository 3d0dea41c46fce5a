"""The engine of the commands that run one in their own process (``brigade generate``, ``brigade bench latency``
and ``throughput``), with the start-up failures ``brigade serve`` reports for its engine process as one line."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brigade.config import BrigadeConfig
    from brigade.entrypoints.llm import LLM


def start_llm(config: BrigadeConfig) -> LLM:
    """``LLM.from_config(config)``, blocking until the engine (and its workers) are ready.

    Raises:
        ConfigError, PluginLoadError: as raised (the CLI prints each as one line).
        EngineStartupError: any other failure while the engine starts (a checkpoint that lacks a tensor or has
            none, a worker rank that died loading its shard), as ``the engine failed to start: <type>: <message>``
            with the cause chained: the CLI prints it as one line, as ``brigade serve`` does.
    """
    from brigade.config import ConfigError
    from brigade.engine.engine_procs import EngineStartupError
    from brigade.entrypoints.llm import LLM
    from brigade.plugins import PluginLoadError

    try:
        return LLM.from_config(config)
    except (ConfigError, PluginLoadError, EngineStartupError):
        raise
    except Exception as exc:
        raise EngineStartupError(f"the engine failed to start: {type(exc).__name__}: {exc}") from exc


def is_engine_startup_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an ``EngineStartupError``, the failure the CLI prints as one line (exit 1). The class is
    looked up only if its module was imported: importing the engine costs torch's import, which commands that start
    no engine (``bench serve``, ``--help``) never pay."""
    procs = sys.modules.get("brigade.engine.engine_procs")
    return procs is not None and isinstance(exc, procs.EngineStartupError)
