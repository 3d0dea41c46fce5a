"""What happened to each plugin in this process: the rows of `brigade plugins`."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from brigade.plugins.registry import PluginSource


class PluginStatus(str, enum.Enum):
    """Outcome of one plugin in this process."""

    LOADED = "loaded"
    DISABLED = "disabled by allowlist"
    FAILED = "failed"
    NOT_DETECTED = "platform not detected"


@dataclass
class PluginRecord:
    """One installed plugin (entry point) and its outcome.

    ``registered`` maps registry field (e.g. "attention_backends") to the names this plugin added;
    ``platforms`` maps each platform it registered to "active", "detected", "not detected" or
    "not checked" once the platform is resolved.
    """

    name: str  # entry-point name; the name allowlists use
    group: str  # entry-point group
    scope: str  # which processes load the group
    distribution: str
    version: str
    value: str  # entry-point value, e.g. "brigade_cuda.plugin"
    status: PluginStatus = PluginStatus.LOADED
    reason: str = ""  # why disabled or failed; notes for loaded plugins
    hooks: list[str] = field(default_factory=list)  # hook names it implements
    hookspec_version: str | None = None  # what it declared in BRIGADE_HOOKSPEC_VERSION
    registered: dict[str, list[str]] = field(default_factory=dict)
    platforms: dict[str, str] = field(default_factory=dict)

    @property
    def source(self) -> PluginSource:
        return PluginSource(self.name, self.distribution, self.version)

    @property
    def status_text(self) -> str:
        """The status as the listing prints it, with the reason for failures and disabled plugins."""
        if self.reason and self.status is not PluginStatus.LOADED:
            return f"{self.status.value}: {self.reason}"
        return self.status.value

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the `brigade plugins --json` row)."""
        return {"name": self.name, "distribution": self.distribution, "version": self.version,
                "group": self.group, "scope": self.scope, "value": self.value, "hooks": list(self.hooks),
                "hookspec_version": self.hookspec_version, "status": self.status.value,
                "reason": self.reason, "registered": {k: list(v) for k, v in self.registered.items()},
                "platforms": dict(self.platforms)}
