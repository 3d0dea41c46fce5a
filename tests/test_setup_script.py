"""scripts/setup.sh's install step: skipped while its stamp is current, redone when a local package went missing.

The script runs on a copy of the checkout's layout whose ``.venv/bin/python`` is a shim: ``-m pip`` and ``-m uv``
calls are only logged (nothing is installed anywhere), everything else runs this interpreter, whose installed
distributions stand for the venv's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def make_checkout(root: Path, pip_log: Path) -> None:
    (root / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "missing_packages.py"):
        shutil.copy(REPO_ROOT / "scripts" / name, root / "scripts" / name)
    (root / "scripts" / "fetch_model.py").write_text("print('/models/stub')\n")
    # The root's own distribution is installed (brigade); the plugin's stands for one uninstalled since.
    (root / "pyproject.toml").write_text('[project]\nname = "brigade"\nversion = "0"\n')
    plugin = root / "plugins" / "gone"
    plugin.mkdir(parents=True)
    (plugin / "pyproject.toml").write_text('[project]\nname = "brigade-surely-not-installed"\nversion = "0"\n')
    shim = root / ".venv" / "bin" / "python"
    shim.parent.mkdir(parents=True)
    shim.write_text('#!/usr/bin/env bash\n'
                    f'if [[ "$1 $2" == "-m pip" || "$1 $2" == "-m uv" ]]; then echo "$@" >> "{pip_log}"; exit 0; fi\n'
                    f'exec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)


def run_setup(root: Path) -> str:
    proc = subprocess.run(["bash", str(root / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def installs(pip_log: Path) -> list[str]:
    lines = pip_log.read_text().splitlines() if pip_log.exists() else []
    # The install of the editables (by uv; pip's own `install uv` before it is not one)
    return [line for line in lines if "install" in line and "--dry-run" not in line and " -e " in line]


def test_a_package_missing_from_the_venv_is_reinstalled_though_the_stamp_is_current(tmp_path):
    root, pip_log = tmp_path / "checkout", tmp_path / "pip.log"
    make_checkout(root, pip_log)
    run_setup(root)  # no stamp yet: installs, then writes the stamp
    assert len(installs(pip_log)) == 1 and "plugins/gone" in installs(pip_log)[0]
    # uv, once pip installed it, writing the .pyc files as pip does
    assert installs(pip_log)[0].startswith("-m uv pip install --quiet --compile-bytecode --python ")
    assert (root / ".venv" / ".brigade-setup-stamp").is_file()

    out = run_setup(root)  # stamp current, but the plugin's distribution is not installed
    assert "not installed in .venv any more: brigade-surely-not-installed; reinstalling" in out
    assert len(installs(pip_log)) == 2

    (root / "plugins" / "gone" / "pyproject.toml").unlink()  # nothing missing now: the stamp's inputs changed once
    run_setup(root)
    assert len(installs(pip_log)) == 3
    out = run_setup(root)
    assert len(installs(pip_log)) == 3 and "reinstalling" not in out
