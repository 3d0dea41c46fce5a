"""Where Brigade keeps files on this machine: the cache root and the model that the set-up builds.

The cache root is ``$BRIGADE_CACHE_DIR``, else ``~/.cache/brigade``. ``scripts/fetch_model.py`` (run by
``scripts/setup.sh``) converts SmolLM2-135M-Instruct into ``<cache>/models/SmolLM2-135M-Instruct``; the
``brigade`` commands that load a model use that directory when none is given (``default_model``), and the
CPU attention kernel is compiled into ``<cache>/kernels``. This module imports nothing heavy (no torch).
"""

from __future__ import annotations

import os
from pathlib import Path

from brigade import envs

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The Brigade cache root: ``explicit``, else ``$BRIGADE_CACHE_DIR``, else ``~/.cache/brigade``.

    The one place that reads ``BRIGADE_CACHE_DIR``; the path may not exist yet.
    """
    if explicit:
        return Path(explicit).expanduser()
    env = envs.BRIGADE_CACHE_DIR
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "brigade"


def default_model_dir(explicit_cache: str | os.PathLike[str] | None = None) -> Path:
    """Where the set-up's model directory lives, ``<cache>/models/SmolLM2-135M-Instruct`` (it may not exist)."""
    return cache_dir(explicit_cache) / "models" / DEFAULT_MODEL_NAME


def default_model() -> Path | None:
    """The set-up's model directory if it has been built, else None (run ``scripts/setup.sh`` to build it)."""
    path = default_model_dir()
    return path if (path / "config.json").is_file() else None
