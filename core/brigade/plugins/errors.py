"""Errors of the plugin framework: loading failures, registry conflicts and unknown names."""

from __future__ import annotations

from collections.abc import Iterable


class PluginLoadError(RuntimeError):
    """A plugin could not be imported or registered where that must stop startup.

    Raised when strict mode (``BRIGADE_PLUGINS_STRICT=1``) is on, when the operator named the failing plugin
    explicitly (``BRIGADE_PLUGINS``, ``BRIGADE_ENDPOINT_PLUGINS``, ``BRIGADE_PLATFORM``), or when platform
    resolution cannot pick one platform. The message carries the plugin, its distribution and the reason.
    """


class PluginRuntimeError(RuntimeError):
    """A plugin's code raised while the server handled a request (a logits processor's ``validate``, say) with
    something other than the errors its contract allows; the message names the plugin, its distribution and
    the error. The request fails (HTTP 500); the server goes on."""


class HookspecVersionError(PluginLoadError):
    """A plugin was built for a different major version of the hook specs; the message names both."""


class DuplicateNameError(PluginLoadError):
    """Two plugins registered the same name in one registry without ``override=True``.

    The message names both plugins and both distributions.
    """


class PlatformConflictError(PluginLoadError):
    """More than one plugin platform detected its hardware and ``BRIGADE_PLATFORM`` did not pick one."""


class UnknownNameError(KeyError, ValueError):
    """A name that no installed plugin registered; the message lists the names that are installed.

    It is a KeyError (a registry is a mapping) and a ValueError (it usually comes from a bad CLI value).
    """

    def __init__(self, kind: str, name: str, installed: Iterable[str]):
        self.kind = kind
        self.name = name
        self.installed = sorted(installed)
        listed = ", ".join(self.installed) if self.installed else "none"
        self.message = f"unknown {kind} {name!r}; installed: {listed}"
        super().__init__(self.message)

    def __str__(self) -> str:
        # KeyError's __str__ would quote the message; show it as written.
        return self.message
