"""A plugin that fails to load: by default a WARNING carrying the reason (never a debug-only log) and the other
plugins still start; BRIGADE_PLUGINS_STRICT=1 makes the same failure fatal, for set-ups that need every plugin."""

from __future__ import annotations

from plugin_env import PluginVenv, record


def test_a_failing_plugin_is_a_warning_with_its_reason_and_startup_continues(default_run):
    listing = default_run.json()
    row = record(listing, "broken")
    assert row["status"] == "failed"
    assert row["reason"] == "RuntimeError: fixture plugin broken on purpose: its import fails"
    warning = [line for line in default_run.stderr.splitlines() if "broken on purpose" in line]
    assert warning and "failed and is skipped" in warning[0]  # WARNING reaches stderr with no log set-up
    assert record(listing, "probe")["status"] == "loaded"
    assert listing["platform"]["name"] == "cpu"


def test_strict_mode_makes_the_same_failure_fatal(plugin_venv: PluginVenv):
    result = plugin_venv.plugins({"BRIGADE_PLUGINS_STRICT": "1"})
    assert result.returncode == 1 and result.stdout == ""
    assert "BRIGADE_PLUGINS_STRICT=1" in result.stderr
    assert "plugin 'broken' (brigade-fixture-broken 0.1.0)" in result.stderr
    assert "broken on purpose" in result.stderr
    healthy = plugin_venv.plugins({"BRIGADE_PLUGINS_STRICT": "1", "BRIGADE_PLUGINS": "probe"})
    assert healthy.returncode == 0, healthy.stderr
