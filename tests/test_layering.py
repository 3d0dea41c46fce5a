"""The layering contract: ``lint-imports`` checks the import-linter contracts of pyproject.toml.

The contracts (``[tool.importlinter]``) say which way Brigade's packages may import: interfaces at the bottom,
entrypoints on top, the scheduler away from the model and from tensors.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _lint_imports() -> str:
    """The venv's ``lint-imports`` (next to this Python), else the one on PATH."""
    beside = Path(sys.executable).parent / "lint-imports"
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    assert found, "lint-imports is not installed: pip install import-linter (in the test extra)"
    return found


def test_the_import_contracts_hold():
    env = dict(os.environ)
    # Analyze this checkout's brigade, whatever else PYTHONPATH holds.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT / "core"), env.get("PYTHONPATH")]))
    result = subprocess.run([_lint_imports(), "--no-cache", "--no-logo"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"lint-imports failed:\n{result.stdout}\n{result.stderr}"


def test_the_scheduler_imports_no_tensor_library():
    """What the contract ignores as type-only (TYPE_CHECKING) must stay so: importing the scheduler loads no torch."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT / "core"), env.get("PYTHONPATH")]))
    code = "import sys, brigade.core.scheduler; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"brigade.core.scheduler imports torch: {result.stdout}"
