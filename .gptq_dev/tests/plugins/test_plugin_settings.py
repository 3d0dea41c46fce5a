"""Operator settings parsed from the environment: unset versus empty allowlists, strictness, forcing."""

from __future__ import annotations

import pytest

from brigade.plugins import PluginLoadError
from brigade.plugins.settings import PluginSettings, parse_allowlist


def test_allowlist_unset_empty_and_listed():
    assert parse_allowlist(None) is None
    assert parse_allowlist("") == frozenset() and parse_allowlist(" , ,") == frozenset()
    assert parse_allowlist("a, b,,c ") == frozenset({"a", "b", "c"})


def test_settings_from_environment():
    s = PluginSettings.from_env({"BRIGADE_PLUGINS": "x,y", "BRIGADE_ENDPOINT_PLUGINS": "",
                                 "BRIGADE_PLATFORM": " oot ", "BRIGADE_PLUGINS_STRICT": "1"})
    assert s == PluginSettings(frozenset({"x", "y"}), frozenset(), "oot", True)
    assert PluginSettings.from_env({}) == PluginSettings(None, None, None, False)


def test_allows_and_named_per_group():
    everything = PluginSettings.from_env({})
    assert everything.allows("any", endpoint=False) and not everything.named("any", endpoint=False)
    assert not everything.allows("admin", endpoint=True)  # endpoints: deny by default
    listed = PluginSettings.from_env({"BRIGADE_PLUGINS": "a", "BRIGADE_ENDPOINT_PLUGINS": "admin"})
    assert listed.allows("a", endpoint=False) and not listed.allows("b", endpoint=False)
    assert listed.named("a", endpoint=False) and listed.named("admin", endpoint=True)
    assert not listed.allows("a", endpoint=True)  # BRIGADE_PLUGINS does not govern endpoints


@pytest.mark.parametrize("raw,strict", [("0", False), ("", False), ("true", True), ("YES", True)])
def test_strict_flag_values(raw, strict):
    assert PluginSettings.from_env({"BRIGADE_PLUGINS_STRICT": raw}).strict is strict


def test_strict_flag_rejects_non_booleans():
    with pytest.raises(PluginLoadError, match="BRIGADE_PLUGINS_STRICT='maybe' is not a boolean"):
        PluginSettings.from_env({"BRIGADE_PLUGINS_STRICT": "maybe"})
