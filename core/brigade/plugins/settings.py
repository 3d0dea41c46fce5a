"""The operator's plugin controls, read from the environment once per load.

``BRIGADE_PLUGINS`` and ``BRIGADE_ENDPOINT_PLUGINS`` distinguish unset from empty on purpose: unset means
"not configured" (load everything, or for endpoints: nothing, with one warning), while an empty string
is an explicit allowlist that matches nothing (load nothing, silently).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from brigade.envs import VARIABLES
from brigade.plugins.errors import PluginLoadError

PLUGINS_ENV = "BRIGADE_PLUGINS"
ENDPOINT_PLUGINS_ENV = "BRIGADE_ENDPOINT_PLUGINS"
PLATFORM_ENV = "BRIGADE_PLATFORM"
STRICT_ENV = "BRIGADE_PLUGINS_STRICT"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def parse_allowlist(raw: str | None) -> frozenset[str] | None:
    """None for unset, the empty set for "" (or only commas and spaces), else the comma-separated names."""
    if raw is None:
        return None
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """Allowlists, forced platform and strictness for one process."""

    allowlist: frozenset[str] | None = None
    """BRIGADE_PLUGINS: None loads every plugin (all groups but endpoints), else exactly these names."""
    endpoint_allowlist: frozenset[str] | None = None
    """BRIGADE_ENDPOINT_PLUGINS: None and empty load no endpoint plugin; unset also warns once."""
    platform: str | None = None
    """BRIGADE_PLATFORM: the platform name to use instead of detection's choice."""
    strict: bool = False
    """BRIGADE_PLUGINS_STRICT=1: any plugin failure aborts startup."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PluginSettings:
        """Read the four variables. Raises PluginLoadError for a strict flag that is not a boolean."""
        raw = {name: VARIABLES[name].raw(env) for name in (PLUGINS_ENV, ENDPOINT_PLUGINS_ENV, PLATFORM_ENV, STRICT_ENV)}
        raw_strict = (raw[STRICT_ENV] or "").strip().lower()
        if raw_strict not in _TRUE + _FALSE:
            raise PluginLoadError(f"{STRICT_ENV}={raw[STRICT_ENV]!r} is not a boolean; use 1 or 0")
        platform = (raw[PLATFORM_ENV] or "").strip() or None
        return cls(allowlist=parse_allowlist(raw[PLUGINS_ENV]),
                   endpoint_allowlist=parse_allowlist(raw[ENDPOINT_PLUGINS_ENV]),
                   platform=platform, strict=raw_strict in _TRUE)

    def allows(self, name: str, *, endpoint: bool) -> bool:
        """Whether plugin ``name`` may load: endpoints need explicit naming, others pass when unlisted."""
        if endpoint:
            return self.endpoint_allowlist is not None and name in self.endpoint_allowlist
        return self.allowlist is None or name in self.allowlist

    def named(self, name: str, *, endpoint: bool) -> bool:
        """Whether the operator named plugin ``name`` explicitly, which makes its failure fatal."""
        chosen = self.endpoint_allowlist if endpoint else self.allowlist
        return chosen is not None and name in chosen
