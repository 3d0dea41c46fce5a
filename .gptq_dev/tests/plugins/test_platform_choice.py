"""choose_platform's rules in isolation: detectors that raise or return junk are reported with their
plugin, a forced platform must detect, two detecting plugins conflict, and the core CPU is the fallback."""

from __future__ import annotations

import pytest

from brigade.platforms.cpu import CpuPlatform, detect_cpu
from brigade.plugins import PlatformConflictError, PluginLoadError
from brigade.plugins.platform_choice import choose_platform
from brigade.plugins.registry import PluginSource, Registries
from brigade.plugins.settings import PluginSettings

CORE = PluginSource("builtin", "brigade", "0.1.0")
VENDOR = PluginSource("vendor", "vendor-platform", "2.0.0")
OTHER = PluginSource("other", "other-platform", "1.0.0")


class VendorPlatform(CpuPlatform):
    name = "vendor"


def _broken_detector():
    raise OSError("driver library is corrupt")


def choose(detectors: dict[str, tuple[PluginSource, object]], settings: PluginSettings | None = None):
    registries = Registries()
    registries.platforms.add("cpu", detect_cpu, CORE)
    for name, (source, detect) in detectors.items():
        registries.platforms.add(name, detect, source)
    failures, states = [], {}

    def report(source, exc, required):
        failures.append((source.plugin, f"{type(exc).__name__}: {exc}", required))
        if required is not None:
            raise PluginLoadError(f"{source.describe()} failed ({required}): {exc}") from exc

    def mark(source, name, state):
        states[name] = state

    choice = choose_platform(registries, settings or PluginSettings(), core_source=CORE,
                             report_failure=report, mark=mark)
    return choice, failures, states


def test_a_raising_detector_is_reported_and_skipped():
    choice, failures, states = choose({"vendor": (VENDOR, _broken_detector)})
    assert choice.name == "cpu" and choice.reason.startswith("no plugin platform detected its hardware")
    assert failures == [("vendor", "OSError: driver library is corrupt", None)]
    assert states == {"vendor": "failed", "cpu": "active"}


def test_a_detector_returning_something_else_than_a_platform_class_is_reported():
    choice, failures, _ = choose({"vendor": (VENDOR, lambda: "vendor.platform:VendorPlatform")})
    assert choice.name == "cpu"
    assert failures[0][0] == "vendor" and "not a Platform subclass or None" in failures[0][1]


def test_the_only_detecting_plugin_platform_wins():
    choice, failures, states = choose({"vendor": (VENDOR, lambda: VendorPlatform), "other": (OTHER, lambda: None)})
    assert (choice.name, choice.platform_cls, choice.source) == ("vendor", VendorPlatform, VENDOR)
    assert sorted(choice.detected) == ["cpu", "vendor"] and failures == []
    assert states == {"vendor": "active", "other": "not detected", "cpu": "detected"}


def test_two_detecting_plugin_platforms_conflict_unless_forced():
    both = {"vendor": (VENDOR, lambda: VendorPlatform), "other": (OTHER, lambda: VendorPlatform)}
    with pytest.raises(PlatformConflictError, match=r"2 plugin platforms detected.*'other' from plugin 'other' "
                                                    r"\(other-platform 1.0.0\).*'vendor' from plugin 'vendor'"):
        choose(both)
    choice, _, states = choose(both, PluginSettings(platform="other"))
    assert choice.name == "other" and choice.reason == "forced by BRIGADE_PLATFORM=other"
    assert states["vendor"] == "not checked"


def test_a_forced_platform_whose_detector_raises_is_fatal_with_the_reason():
    with pytest.raises(PluginLoadError, match=r"named its platform in BRIGADE_PLATFORM=vendor\): driver library"):
        choose({"vendor": (VENDOR, _broken_detector)}, PluginSettings(platform="vendor"))


def test_forcing_the_cpu_platform_skips_plugin_detection():
    choice, _, states = choose({"vendor": (VENDOR, lambda: VendorPlatform)}, PluginSettings(platform="cpu"))
    assert choice.platform_cls is CpuPlatform and states == {"vendor": "not checked", "cpu": "active"}
