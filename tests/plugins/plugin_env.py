"""Helpers for the plugin tests: a throwaway virtualenv where plugin packages are really installed and uninstalled with pip.

The venv is built from the base interpreter without pip (fast), and one .pth file makes the project's
dependencies (torch, pluggy, pip, setuptools...) and the working tree's ``core/`` importable in it, so
nothing is downloaded or copied. The dependencies come through a view of the development site-packages
that leaves out any Brigade plugin installed there, so only the plugins the tests install are seen. Plugins then go in with ``pip install --no-deps --no-build-isolation
--no-index -e DIR``: real distributions with real entry points, discovered through importlib.metadata
exactly as in production. Assertions read ``brigade plugins --json`` run in a subprocess of that venv.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import brigade

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Real packages of the project, installed in the session venv.
PROJECT_PLUGINS = [REPO_ROOT / "builtin_platforms" / "cuda", REPO_ROOT / "builtin_platforms" / "rocm",
                   REPO_ROOT / "plugins" / "oot_platform", REPO_ROOT / "plugins" / "io_processor_example",
                   REPO_ROOT / "plugins" / "jsonl_stat_logger", REPO_ROOT / "plugins" / "reset_cache_endpoint",
                   REPO_ROOT / "plugins" / "oot_model"]
# Test fixtures: broken import, a duplicate pair, two detecting platforms, a wrong major version, a healthy
# probe, a misspelt hook and an endpoint that needs a task the server lacks.
FIXTURE_PLUGINS = [FIXTURES / name for name in ("broken", "dup_a", "dup_b", "detect_a", "detect_b",
                                                "wrong_version", "probe", "typo_hook", "embed_endpoint")]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        return json.loads(self.stdout)


@dataclass
class PluginVenv:
    """A venv with its own site-packages for plugins; the core and its dependencies come from the dev env."""

    root: Path

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The caller's environment without any BRIGADE_* setting or PYTHONPATH, plus ``extra``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRIGADE_") and k != "PYTHONPATH"}
        env.update(extra or {})
        return env

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> Result:
        proc = subprocess.run([self.python, *args], env=self.env(env), capture_output=True, text=True,
                              timeout=timeout, cwd=self.root)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def pip(self, *args: str) -> Result:
        result = self.run("-m", "pip", "--disable-pip-version-check", *args)
        assert result.returncode == 0, f"pip {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
        return result

    def install(self, *dirs: Path) -> None:
        editable = [arg for d in dirs for arg in ("-e", str(d))]
        self.pip("install", "-q", "--no-deps", "--no-build-isolation", "--no-index", *editable)

    def uninstall(self, *dists: str) -> None:
        self.pip("uninstall", "-y", "-q", *dists)

    def plugins(self, env: dict[str, str] | None = None) -> Result:
        """``brigade plugins --json`` in this venv."""
        return self.run("-m", "brigade.entrypoints.cli.plugins", "--json", env=env)

    def plugins_json(self, env: dict[str, str] | None = None) -> dict:
        result = self.plugins(env)
        assert result.returncode == 0, f"brigade plugins failed ({result.returncode}):\n{result.stderr}"
        return result.json()


def _plugin_distributions(site: Path) -> set[str]:
    """Normalized names of the distributions in ``site`` that declare brigade.* entry points (the core
    itself excepted): plugins installed in the development environment, hidden from the test venv."""
    found = set()
    for info in site.glob("*.dist-info"):
        entry_points = info / "entry_points.txt"
        name = re.sub(r"[-_.]+", "_", info.name.removesuffix(".dist-info").rsplit("-", 1)[0]).lower()
        if name != "brigade" and entry_points.is_file() and "[brigade." in entry_points.read_text():
            found.add(name)
    return found


def _dependency_view(dev_site: Path, view: Path) -> None:
    """Symlink every entry of the development site-packages into ``view`` except plugin distributions
    (their dist-info and editable hooks), so the test venv sees the dependencies but only the plugins the
    tests install themselves."""
    hidden = _plugin_distributions(dev_site)
    view.mkdir()
    for entry in dev_site.iterdir():
        key = re.sub(r"[-_.]+", "_", entry.name).lower().removeprefix("_editable_")
        if any(key.startswith(f"{name}_") or key == name for name in hidden):
            continue
        (view / entry.name).symlink_to(entry)


def make_venv(root: Path) -> PluginVenv:
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run([str(base_python), "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    venv = PluginVenv(root / "venv")
    purelib = subprocess.run([venv.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    core_dir = Path(brigade.__file__).resolve().parents[1]
    view = root / "dev-site-packages"
    _dependency_view(Path(sysconfig.get_paths()["purelib"]), view)
    # addsitedir (not a plain path line) so the dependencies' own .pth files are processed too.
    (Path(purelib) / "_brigade_dev.pth").write_text(f"{core_dir}\nimport site; site.addsitedir({str(view)!r})\n")
    return venv


def record(listing: dict, name: str) -> dict:
    """The row of plugin ``name`` in a ``brigade plugins --json`` listing; fails when it is absent."""
    rows = [p for p in listing["plugins"] if p["name"] == name]
    assert len(rows) == 1, f"expected one plugin {name!r}, got {[p['name'] for p in listing['plugins']]}"
    return rows[0]


def run_script(venv: PluginVenv, code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in the venv; it must print one JSON document as its last stdout line."""
    result = venv.run("-c", code, env=env)
    assert result.returncode == 0, f"script failed ({result.returncode}):\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])
