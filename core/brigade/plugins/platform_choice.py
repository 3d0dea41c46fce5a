"""Platform resolution: which registered platform this process runs on, and why.

Rules, in order:
  1. ``BRIGADE_PLATFORM=NAME`` forces NAME; only its detector runs, and it must detect its hardware.
  2. Exactly one plugin platform that detects its hardware beats the core's CPU platform.
  3. Two or more detecting plugin platforms are an error naming them all.
  4. Otherwise the core's CPU platform runs.
Detectors must have no side effects (no CUDA context), so running every one of them is safe before a fork.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from brigade.plugins.errors import PlatformConflictError, PluginLoadError
from brigade.plugins.registry import PluginSource, Registries, Registration
from brigade.plugins.settings import PLATFORM_ENV, PluginSettings

if TYPE_CHECKING:
    from brigade.platforms.interface import Platform

FailureReporter = Callable[[PluginSource, BaseException, "str | None"], None]
"""(source, exception, why it must succeed or None) -> None; raises when the failure must stop startup
(strict mode, or a reason is given), else logs a WARNING."""
StateMarker = Callable[[PluginSource, str, str], None]
"""(source, platform name, state) -> None; records "active", "detected", "not detected", "not checked"."""


@dataclass(frozen=True, slots=True)
class PlatformChoice:
    """The chosen platform, the plugin that provided it, and the reason in one sentence."""

    name: str
    platform_cls: type[Platform]
    source: PluginSource
    reason: str
    detected: tuple[str, ...]  # every platform whose detector found its hardware (those that ran)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "class": f"{self.platform_cls.__module__}.{self.platform_cls.__qualname__}",
                "plugin": self.source.plugin, "distribution": self.source.distribution,
                "version": self.source.version, "reason": self.reason, "detected": list(self.detected)}


def _run_detector(entry: Registration, registries: Registries) -> type[Platform] | None:
    """Call one detector and check what it returned. Raises TypeError for anything but a Platform class."""
    from brigade.platforms.interface import Platform

    detect = registries.platforms.get(entry.name)
    result = detect()
    if result is not None and not (isinstance(result, type) and issubclass(result, Platform)):
        raise TypeError(f"platform detector {entry.name!r} returned {result!r}, not a Platform subclass or None")
    return result


def choose_platform(registries: Registries, settings: PluginSettings, *, core_source: PluginSource,
                    report_failure: FailureReporter, mark: StateMarker) -> PlatformChoice:
    """Run the detectors and pick the platform by the rules in the module docstring.

    Raises:
        PluginLoadError: BRIGADE_PLATFORM names an unknown platform or one that does not detect; no
            platform at all is registered; or a failing detector is fatal (strict mode, or forced).
        PlatformConflictError: two or more plugin platforms detect and none is forced.
    """
    entries = registries.platforms.entries()
    if settings.platform is not None:
        return _forced(settings.platform, entries, registries, report_failure, mark)
    detected: list[tuple[Registration, type[Platform]]] = []
    for entry in entries:
        try:
            platform_cls = _run_detector(entry, registries)
        except (Exception, SystemExit) as exc:  # a vendor's detector can raise anything; report it with its reason
            report_failure(entry.source, exc, None)
            mark(entry.source, entry.name, "failed")
            continue
        mark(entry.source, entry.name, "detected" if platform_cls is not None else "not detected")
        if platform_cls is not None:
            detected.append((entry, platform_cls))
    detected_names = tuple(e.name for e, _ in detected)
    plugin_hits = [(e, cls) for e, cls in detected if e.source != core_source]
    if len(plugin_hits) > 1:
        listed = ", ".join(f"{e.name!r} from {e.source.describe()}" for e, _ in plugin_hits)
        raise PlatformConflictError(f"{len(plugin_hits)} plugin platforms detected their hardware: {listed}; "
                                    f"pick one with {PLATFORM_ENV}=NAME or uninstall the others")
    if plugin_hits:
        entry, cls = plugin_hits[0]
        reason = (f"the only plugin platform that detected its hardware ({entry.source.describe()}); "
                  f"a detecting plugin platform beats the core CPU platform")
    else:
        core_hits = [(e, cls) for e, cls in detected if e.source == core_source]
        if not core_hits:
            raise PluginLoadError("no platform detected its hardware and the core CPU platform is missing; "
                                  f"registered platforms: {', '.join(registries.platforms.names()) or 'none'}")
        entry, cls = core_hits[0]
        checked = [e.name for e in entries if e.source != core_source]
        reason = ("no plugin platform detected its hardware (checked: " + ", ".join(checked) + ")"
                  if checked else "no plugin platform is installed")
        reason += f"; falling back to the core {entry.name} platform"
    mark(entry.source, entry.name, "active")
    return PlatformChoice(entry.name, cls, entry.source, reason, detected_names)


def unknown_platform_error(name: str, registered: list[str]) -> PluginLoadError:
    """The error for a BRIGADE_PLATFORM that no installed plugin registers, listing those that are."""
    return PluginLoadError(f"{PLATFORM_ENV}={name} but no installed plugin registers platform {name!r}; "
                           f"registered platforms: {', '.join(registered) or 'none'}")


def _forced(name: str, entries: list[Registration], registries: Registries, report_failure: FailureReporter,
            mark: StateMarker) -> PlatformChoice:
    chosen = [e for e in entries if e.name == name]
    if not chosen:
        raise unknown_platform_error(name, [e.name for e in entries])
    entry = chosen[0]
    for other in entries:
        if other is not entry:
            mark(other.source, other.name, "not checked")
    try:
        platform_cls = _run_detector(entry, registries)
    except (Exception, SystemExit) as exc:  # forced means named by the operator, so report_failure raises
        mark(entry.source, entry.name, "failed")
        report_failure(entry.source, exc, f"the operator named its platform in {PLATFORM_ENV}={name}")
        raise
    if platform_cls is None:
        mark(entry.source, entry.name, "not detected")
        raise PluginLoadError(f"{PLATFORM_ENV}={name} but platform {name!r} from {entry.source.describe()} did "
                              "not detect its hardware on this machine")
    mark(entry.source, entry.name, "active")
    return PlatformChoice(name, platform_cls, entry.source, f"forced by {PLATFORM_ENV}={name}", (name,))
