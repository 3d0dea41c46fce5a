"""The self-check questions of book chapter 13 ("Système de plugins et extensibilité"), as tests.

Q1: what if a plugin's load failure propagated instead of being caught? Brigade's answer: by default a
    failure is a WARNING carrying the reason (never a debug-only log) and the rest still start;
    BRIGADE_PLUGINS_STRICT=1 makes it fatal, for production set-ups that need every plugin.
Q2: endpoint allowlist unset versus empty: same result (no endpoint), different intent: unset warns
    once naming what is installed but disabled, empty is an explicit "none" and stays silent.
Q3: an empty CUDA_VISIBLE_DEVICES (Ray's CPU-only placement groups) counts as unset: logical ids map to
    physical ids unchanged instead of failing on int("").
"""

from __future__ import annotations

from typing import ClassVar

from plugin_env import PluginVenv, record

from brigade.platforms.interface import Platform

ENDPOINT_WARNING = "endpoint plugins are installed but not enabled"


def test_q1_a_failing_plugin_is_a_warning_with_its_reason_and_startup_continues(default_run):
    listing = default_run.json()
    row = record(listing, "broken")
    assert row["status"] == "failed"
    assert row["reason"] == "RuntimeError: fixture plugin broken on purpose: its import fails"
    warning = [line for line in default_run.stderr.splitlines() if "broken on purpose" in line]
    assert warning and "failed and is skipped" in warning[0]  # WARNING reaches stderr with no log set-up
    assert record(listing, "probe")["status"] == "loaded"
    assert listing["platform"]["name"] == "cpu"


def test_q1_strict_mode_makes_the_same_failure_fatal(plugin_venv: PluginVenv):
    result = plugin_venv.plugins({"BRIGADE_PLUGINS_STRICT": "1"})
    assert result.returncode == 1 and result.stdout == ""
    assert "BRIGADE_PLUGINS_STRICT=1" in result.stderr
    assert "plugin 'broken' (brigade-fixture-broken 0.1.0)" in result.stderr
    assert "broken on purpose" in result.stderr
    healthy = plugin_venv.plugins({"BRIGADE_PLUGINS_STRICT": "1", "BRIGADE_PLUGINS": "probe"})
    assert healthy.returncode == 0, healthy.stderr


def test_q2_endpoint_allowlist_unset_warns_once_and_empty_is_silent(plugin_venv: PluginVenv, default_run):
    empty = plugin_venv.plugins({"BRIGADE_ENDPOINT_PLUGINS": ""})
    assert empty.returncode == 0, empty.stderr
    for run in (default_run, empty):
        listing = run.json()
        assert listing["registries"]["endpoints"] == []
        assert record(listing, "reset_prefix_cache")["status"] == "disabled by allowlist"
    assert default_run.stderr.count(ENDPOINT_WARNING) == 1
    assert ENDPOINT_WARNING not in empty.stderr
    assert "BRIGADE_ENDPOINT_PLUGINS is unset" in record(default_run.json(), "reset_prefix_cache")["reason"]
    assert record(empty.json(), "reset_prefix_cache")["reason"] == "not in BRIGADE_ENDPOINT_PLUGINS="


class _CudaLike(Platform):
    name: ClassVar[str] = "cuda_like"
    device_type: ClassVar[str] = "cuda"
    device_control_env_var: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"


def test_q3_empty_visible_devices_counts_as_unset(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _CudaLike.visible_device_ids() is None
    assert [_CudaLike.logical_to_physical(i) for i in range(3)] == [0, 1, 2]
    assert _CudaLike.physical_to_logical(5) == 5
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _CudaLike.logical_to_physical(2) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert _CudaLike.logical_to_physical(0) == 4  # set: the list remaps
