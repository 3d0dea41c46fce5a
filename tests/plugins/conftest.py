"""Fixtures of the plugin tests: the session venv with every project and fixture plugin installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoints"))  # remote_server, for the server tests

from plugin_env import FIXTURE_PLUGINS, PROJECT_PLUGINS, PluginVenv, make_venv  # noqa: E402


@pytest.fixture(scope="session")
def plugin_venv(tmp_path_factory) -> PluginVenv:
    """The session venv with every project plugin and every fixture plugin installed."""
    venv = make_venv(tmp_path_factory.mktemp("plugin-venv"))
    venv.install(*PROJECT_PLUGINS, *FIXTURE_PLUGINS)
    return venv


@pytest.fixture(scope="session")
def default_run(plugin_venv: PluginVenv):
    """``brigade plugins --json`` in the session venv with no BRIGADE_* variable set."""
    result = plugin_venv.plugins()
    assert result.returncode == 0, result.stderr
    return result
