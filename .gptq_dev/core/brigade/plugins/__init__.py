"""Brigade's plugin framework: hook specs, entry-point loading, registries and platform choice (book ch. 13).

The core uses three names::

    from brigade.plugins import load_plugins, registries, current_platform
    load_plugins("engine")                      # general + platform plugins; "api" adds the API-only groups
    registries.attention_backends.get("reference")
    current_platform()                           # the Platform class of this process, resolved once

They act on this process's one ``PluginManager``. A forked child inherits its loaded state; a spawned
child starts empty and calls ``load_plugins`` again (it is idempotent, so every entry point may call it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from brigade.plugins.errors import (DuplicateNameError, HookspecVersionError, PlatformConflictError,
                                    PluginLoadError, UnknownNameError)
from brigade.plugins.hookspecs import HOOKSPEC_VERSION, hookimpl
from brigade.plugins.manager import PluginManager
from brigade.plugins.platform_choice import PlatformChoice
from brigade.plugins.records import PluginRecord, PluginStatus
from brigade.plugins.registry import Registration, Registries, Registry

if TYPE_CHECKING:
    from brigade.platforms.interface import Platform

# The process's manager. Constructing it reads nothing and imports no plugin; loading happens only in
# load_plugins/current_platform.
_process_manager = PluginManager()

registries: Registries = _process_manager.registries
"""This process's registries (filled by load_plugins)."""


def process_plugin_manager() -> PluginManager:
    """The manager behind the module-level functions (for listings and tests)."""
    return _process_manager


def load_plugins(scope: str = "engine") -> None:
    """Load the plugin groups of ``scope`` once per process: "engine" (general + platform) or "api" (adds
    io_processor, stat_logger and endpoint plugins). Raises PluginLoadError on a fatal plugin failure."""
    _process_manager.load(scope)


def current_platform() -> type[Platform]:
    """This process's Platform class, resolved on first call. Raises PluginLoadError when none fits."""
    return _process_manager.current_platform()


def platform_choice() -> PlatformChoice:
    """The chosen platform with the plugin that provides it and the reason."""
    return _process_manager.platform_choice()


def plugin_records() -> list[PluginRecord]:
    """Every plugin seen by this process, with its status."""
    return _process_manager.records()


def select_endpoints(supported_tasks: Iterable[str]) -> list[Registration]:
    """Endpoint registrations to mount on a server supporting ``supported_tasks`` (router factories are
    ``registration.value``, possibly a lazy path: use ``registries.endpoints.get(registration.name)``)."""
    return _process_manager.select_endpoints(supported_tasks)


def plugin_choices() -> dict[str, list[str]]:
    """Installed names for the CLI's plugin-backed flags (call after load_plugins("api"))."""
    return {"quantization": registries.quantization_methods.names(),
            "attention_backend": registries.attention_backends.names(),
            "kv_connector": registries.kv_connectors.names(),
            "io_processor": registries.io_processors.names()}


__all__ = ["HOOKSPEC_VERSION", "DuplicateNameError", "HookspecVersionError", "PlatformChoice",
           "PlatformConflictError", "PluginLoadError", "PluginManager", "PluginRecord", "PluginStatus",
           "Registration", "Registries", "Registry", "UnknownNameError", "current_platform", "hookimpl",
           "load_plugins", "platform_choice", "plugin_choices", "plugin_records", "process_plugin_manager",
           "registries", "select_endpoints"]
