"""Brigade's plugin framework: hook specs, entry-point loading, registries and platform choice.

The core uses three names::

    from brigade.plugins import load_plugins, registries, current_platform
    load_plugins("engine")                      # general + platform plugins; "api" adds the API-only groups
    registries.attention_backends.get("reference")
    current_platform()                           # the Platform class of this process, resolved once

They act on this process's one ``PluginManager``. A forked child inherits its loaded state; a spawned
child starts empty and calls ``load_plugins`` again (it is idempotent, so every entry point may call it).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from brigade.plugins.errors import (DuplicateNameError, HookspecVersionError, PlatformConflictError,
                                    PluginLoadError, UnknownNameError)
from brigade.plugins.hookspecs import HOOKSPEC_VERSION, hookimpl
from brigade.plugins.manager import PluginManager
from brigade.plugins.platform_choice import PlatformChoice
from brigade.plugins.records import PluginRecord, PluginStatus
from brigade.plugins.registry import Registration, Registries, Registry
from brigade.plugins.settings import PLUGINS_ENV

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


def allowlist_note(name: str) -> str | None:
    """Why ``name`` (a quantization method, attention backend, KV connector or IO processor that a flag asks
    for) may be missing although its plugin is installed: BRIGADE_PLUGINS excludes installed plugins. A clause naming the variable and how to include the plugin, or None when BRIGADE_PLUGINS excludes
    nothing. A plugin named like ``name`` is taken to be the one providing it (brigade-gptq's plugin "gptq"
    provides the method "gptq"); otherwise the excluded plugins are listed.
    """
    excluded = _process_manager.excluded_by_allowlist()
    if not excluded:
        return None
    allow = sorted(_process_manager.settings.allowlist or ())
    current = f"{PLUGINS_ENV}={','.join(allow)}" if allow else f'{PLUGINS_ENV}=""'  # "" loads no plugin
    for record in excluded:
        if record.name == name:
            return (f"the installed plugin {record.name!r} ({record.distribution} {record.version}) is excluded by "
                    f"{current}; include it with {PLUGINS_ENV}={','.join([*allow, record.name])}, or unset "
                    f"{PLUGINS_ENV} to load every installed plugin")
    names = ", ".join(sorted({r.name for r in excluded}))
    return (f"no loaded plugin provides it, and {current} excludes the installed plugins {names}: if one of them "
            f"provides {name!r}, add it to {PLUGINS_ENV}")


def unavailable_message(what: str, value: str, installed: Iterable[str]) -> str:
    """The one-line error for ``what value`` (``--quantization 'gptq'``) that no loaded plugin registered:
    "is not installed", or, when BRIGADE_PLUGINS keeps installed plugins from loading, why it is not available
    and how to include its plugin (allowlist_note). ``installed``: the names loaded plugins registered."""
    installed = list(installed)
    note = allowlist_note(value)
    if note is None:
        return (f"{what} {value!r} is not installed; installed: {', '.join(installed) or 'none installed'}"
                f"{_did_you_mean(value, installed)}")
    return f"{what} {value!r} is not available: {note}; available: {', '.join(installed) or 'none'}"


def _did_you_mean(value: str, names: list[str]) -> str:
    """`` (did you mean 'fp8'?)`` for the installed name closest to a mistyped one (case aside), as the CLI
    answers an unknown flag; "" when none is close."""
    lowered = {name.lower(): name for name in names}
    close = difflib.get_close_matches(value.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


def plugin_choices() -> dict[str, list[str]]:
    """Installed names for the CLI's plugin-backed flags (call after load_plugins("api"))."""
    return {"quantization": registries.quantization_methods.names(),
            "attention_backend": registries.attention_backends.names(),
            "kv_connector": registries.kv_connectors.names(),
            "io_processor": registries.io_processors.names()}


__all__ = ["HOOKSPEC_VERSION", "DuplicateNameError", "HookspecVersionError", "PlatformChoice",
           "PlatformConflictError", "PluginLoadError", "PluginManager", "PluginRecord", "PluginStatus",
           "Registration", "Registries", "Registry", "UnknownNameError", "allowlist_note", "current_platform",
           "hookimpl", "load_plugins", "platform_choice", "plugin_choices", "plugin_records",
           "process_plugin_manager", "registries", "select_endpoints", "unavailable_message"]
