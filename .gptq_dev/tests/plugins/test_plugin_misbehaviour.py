"""Plugins that misbehave in ways an ``except Exception`` or a trusting registry would miss: one calls
``sys.exit()`` while it is imported (it used to end every ``brigade`` command silently, exit status 0), one
registers an int as its stat logger (it used to be listed as loaded and crash the server later, unnamed).
Both are real packages installed with pip in their own venv, so no other test sees them."""

from __future__ import annotations

import pytest

from plugin_env import FIXTURES, PluginVenv, make_venv, record


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> PluginVenv:
    venv = make_venv(tmp_path_factory.mktemp("misbehaving-plugins"))
    venv.install(FIXTURES / "exits", FIXTURES / "garbage_stat")
    return venv


def test_a_plugin_that_exits_on_import_is_reported_and_the_command_goes_on(venv):
    result = venv.plugins()
    assert result.returncode == 0, result.stderr
    row = record(result.json(), "exits")
    assert row["status"] == "failed" and row["reason"] == "SystemExit: 0"
    assert "plugin 'exits' (brigade-fixture-exits 0.1.0) in group brigade.general_plugins failed and is " \
           "skipped: SystemExit: 0" in result.stderr
    version = venv.run("-m", "brigade.entrypoints.cli.main", "--version")
    assert version.returncode == 0 and version.stdout.strip(), version.stderr


def test_a_plugin_that_exits_on_import_is_fatal_in_strict_mode(venv):
    result = venv.plugins({"BRIGADE_PLUGINS_STRICT": "1"})
    assert result.returncode != 0
    assert "plugin 'exits' (brigade-fixture-exits 0.1.0)" in result.stderr and "SystemExit: 0" in result.stderr


def test_a_stat_logger_registered_as_an_int_fails_its_plugin_by_name(venv):
    result = venv.plugins()
    row = record(result.json(), "garbage_stat")
    assert row["status"] == "failed"
    assert row["reason"] == ("ValueError: stat logger 'garbage_logger' must be registered as a class or factory "
                             "(or a 'module:Attr' path to one), got int 42")
    assert "plugin 'garbage_stat' (brigade-fixture-garbage-stat 0.1.0)" in result.stderr
