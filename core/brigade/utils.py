"""Small helpers shared across the core."""

from __future__ import annotations

import atexit
import gc
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


def freeze_gc_heap() -> int:
    """One last full collection, then ``gc.freeze()``: every object alive now leaves the cyclic garbage
    collector's reach. Returns the number of frozen objects.

    Called once a process has finished starting (the engine core, each worker, the API server). Start-up
    leaves about 300k long-lived objects (imported modules, the model's Python objects, the tokenizer), and
    each full (generation 2) collection walks all of them (``docs/performance-notes.md`` has the cost), a stall
    of every running request whenever one strikes while serving.
    Frozen objects are never scanned again; objects made later are collected as usual. vLLM freezes its
    start-up heap the same way. At exit the heap is unfrozen and collected once (an ``atexit`` hook): extension
    modules that count their live objects at teardown (Triton's nanobind bindings, imported by torch's meta-device
    ops) would otherwise print every frozen one as leaked.
    """
    gc.collect()
    gc.freeze()
    atexit.unregister(_unfreeze_and_collect)  # one hook however often a process freezes
    atexit.register(_unfreeze_and_collect)
    return gc.get_freeze_count()


def _unfreeze_and_collect() -> None:
    gc.unfreeze()
    try:
        gc.collect()
    except (SystemExit, KeyboardInterrupt):
        # A stop signal (the engine core's SIGTERM handler raises SystemExit) that lands while the process is
        # already exiting asks for nothing more; left to propagate, Python prints it as a traceback at exit.
        pass
