"""Every ``BRIGADE_*`` environment variable the sources mention is declared once in a distribution's ``envs.py``
and listed in docs/environment.md; declared variables are read when used, not at import."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from brigade import envs

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\bBRIGADE_[A-Z0-9_]*[A-Z0-9]\b")
DECLARED = re.compile(r'EnvVar\(\s*"(BRIGADE_[A-Z0-9_]+)"')

NOT_VARIABLES = {
    "BRIGADE_HOOKSPEC_VERSION": "a plugin module's attribute (the hook-spec version it was built for), not a variable",
    "BRIGADE_CUDA": "a prefix: profiling scripts record every BRIGADE_CUDA_* switch that is set",
    "BRIGADE_FIXTURE_DETECT": "read only by the test fixture platforms under tests/plugins/fixtures",
}


def tracked_sources() -> list[Path]:
    """Tracked Python files, and shell scripts outside benchmark run folders (which set, not read, switches)."""
    out = subprocess.run(["git", "ls-files", "*.py", "scripts/*.sh", ".ci/*"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if line]


def declarations() -> dict[str, list[str]]:
    """{variable: the envs.py files declaring it}."""
    found: dict[str, list[str]] = {}
    for path in tracked_sources():
        if path.name == "envs.py":
            for name in DECLARED.findall(path.read_text()):
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_variable_mentioned_is_declared_and_documented():
    declared = declarations()
    documented = set(NAME.findall((ROOT / "docs" / "environment.md").read_text()))
    missing: dict[str, set[str]] = {}
    for path in tracked_sources():
        if not path.is_file():
            continue
        for name in set(NAME.findall(path.read_text(errors="replace"))) - set(NOT_VARIABLES):
            if name not in declared or name not in documented:
                missing.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert not missing, f"declare these in an envs.py and list them in docs/environment.md: {missing}"


def test_each_variable_is_declared_once_and_every_declared_one_is_documented():
    declared = declarations()
    assert {name: files for name, files in declared.items() if len(files) > 1} == {}
    documented = set(NAME.findall((ROOT / "docs" / "environment.md").read_text()))
    assert set(declared) <= documented
    assert set(envs.VARIABLES) <= set(declared)


def test_variables_are_read_when_used(monkeypatch):
    monkeypatch.setenv("BRIGADE_ENGINE_STARTUP_TIMEOUT", "12.5")
    assert envs.BRIGADE_ENGINE_STARTUP_TIMEOUT == 12.5
    monkeypatch.delenv("BRIGADE_ENGINE_STARTUP_TIMEOUT")
    assert envs.BRIGADE_ENGINE_STARTUP_TIMEOUT == 600.0
    monkeypatch.setenv("BRIGADE_PLUGINS_STRICT", "maybe")
    with pytest.raises(ValueError, match="BRIGADE_PLUGINS_STRICT='maybe' is not a boolean"):
        envs.VARIABLES["BRIGADE_PLUGINS_STRICT"].get()
    assert envs.VARIABLES["BRIGADE_PLUGINS"].get({"BRIGADE_PLUGINS": " a, b ,"}) == ("a", "b")
    with pytest.raises(AttributeError, match="no environment variable"):
        getattr(envs, "BRIGADE_" + "UNDECLARED")


def test_a_plugin_distribution_declares_its_own(monkeypatch):
    from brigade_cuda import envs as cuda_envs

    monkeypatch.setenv("BRIGADE_CUDA_PDL", "0")
    assert cuda_envs.BRIGADE_CUDA_PDL is False
    monkeypatch.setenv("BRIGADE_CUDA_PDL", "")
    assert cuda_envs.BRIGADE_CUDA_PDL is True  # empty: the default
