"""Print the distributions of local package folders that this interpreter does not have installed, one a line.

scripts/setup.sh runs it with the venv's Python over brigade's root and every LOCAL_PACKAGES folder, and
reinstalls when it prints anything: its stamp only records the inputs, so a package uninstalled since
(``pip uninstall brigade-fp8``) would otherwise stay missing while the stamp is current.

Usage: python scripts/missing_packages.py DIR [DIR ...]   (each DIR holds a pyproject.toml)
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path


def distribution_name(folder: Path) -> str | None:
    """The ``[project] name`` of ``folder/pyproject.toml``, or None when it names none."""
    text = (folder / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the one line setup.sh needs, read without a TOML parser
        section = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
        found = section and re.search(r"""^name\s*=\s*["']([^"']+)["']""", section.group(1), re.M)
        return found.group(1) if found else None
    return tomllib.loads(text).get("project", {}).get("name")


def is_installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing(folders: list[Path]) -> list[str]:
    """The names of the folders' distributions that are not installed (a folder naming none is skipped)."""
    names = [distribution_name(folder) for folder in folders]
    return [name for name in names if name is not None and not is_installed(name)]


if __name__ == "__main__":
    for missing_name in missing([Path(arg) for arg in sys.argv[1:]]):
        print(missing_name)
