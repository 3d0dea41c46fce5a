"""Small helpers shared across the core."""

from __future__ import annotations

import importlib
import socket


def resolve_obj_by_qualname(qualname: str):
    """Import ``package.module.Attr`` (or ``package.module:Attr``). Raises ImportError naming the path."""
    module_name, _, attr = qualname.replace(":", ".").rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"cannot import {qualname!r}: {exc}") from exc


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def get_open_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
