"""Loud warnings for Triton kernels compiled while serving.

Triton compiles a kernel once per *variant*: per value of its compile-time constants and per specialization
of its other arguments (an integer equal to 1 or divisible by 16, a pointer aligned to 16 bytes). A variant
first needed in the middle of serving compiles on the spot, and every running request waits for it, up to a
second or more. Brigade warms up what a step may need at start-up (decode graphs, mixed steps, the sampler),
and its kernels mark step-dependent integers ``do_not_specialize``; a variant that still appears later is a
bug. This module names it: from ``watch()`` on (at worker start, before anything compiles) it records each
variant a process compiles, and after ``mark_serving()`` (once start-up is done) it logs a WARNING for each
new one, with the arguments whose specialization differs from the closest variant compiled at start-up.
The case it was written for: unaligned input views, whose alignment changed with each step's token counts,
compiled variants mid-serving and cost 1.76 s inter-token stalls on an H200.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def describe_variant(signature: dict[str, Any], constants: dict[Any, Any], attrs: dict[Any, Any]) -> dict[str, str]:
    """One string per kernel argument naming what its variant was compiled for.

    Args:
        signature: argument name -> Triton type string ("*bf16", "i32", "constexpr"), in argument order.
        constants: ``(arg index,)`` path -> value of each compile-time constant.
        attrs: ``(arg index,)`` path -> list of ``[attribute, value]`` pairs (``tt.divisibility`` for an
            aligned pointer or an integer divisible by 16).
    """
    names = list(signature)
    out = {name: str(kind) for name, kind in signature.items()}

    def name_of(path: Any) -> str | None:
        index = path[0] if isinstance(path, tuple) and path else path
        return names[index] if isinstance(index, int) and 0 <= index < len(names) else None

    for path, value in constants.items():
        if (name := name_of(path)) is not None:
            out[name] = f"{out[name]}={value!r}"
    for path, pairs in attrs.items():
        if (name := name_of(path)) is not None:
            out[name] += "".join(f" {key}={val}" for key, val in pairs)
    return out


class CompileWatch:
    """A Triton ``jit_cache_hook``: called once per variant a process compiles (or loads from the disk cache)
    into memory, before it does so. Records each variant; once serving, warns about each new one. It never
    skips a compile, and calls a hook installed before it (``previous``) and returns what that one returns."""

    def __init__(self, previous: Any = None):
        self.previous = previous
        self.serving = False
        self.variants: dict[str, list[dict[str, str]]] = {}  # kernel name -> descriptions, in compile order
        self.late: list[str] = []  # names of the kernels compiled while serving, in order

    def __call__(self, *, fn: Any = None, compile: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        result = self.previous(fn=fn, compile=compile, **kwargs) if self.previous is not None else None
        if result:  # the previous hook skips this compile
            return result
        compile = compile or {}
        configs = compile.get("configs") or [{}]
        variant = describe_variant(compile.get("signature") or {}, compile.get("constants") or {}, configs[0])
        name = getattr(fn, "name", None) or str(fn)
        known = self.variants.setdefault(name, [])
        if self.serving:
            self.late.append(name)
            logger.warning("Triton is compiling a new variant of %s while serving: every running request waits "
                           "for it (up to a second or more). %s. Brigade should have compiled it at start-up; "
                           "please report this line.", name, self._difference(variant, known))
        known.append(variant)
        return result

    @staticmethod
    def _difference(variant: dict[str, str], known: list[dict[str, str]]) -> str:
        if not known:
            return "No variant of it was compiled at start-up"
        def changed(other: dict[str, str]) -> list[str]:
            return [k for k in variant.keys() | other.keys() if variant.get(k) != other.get(k)]
        closest = min(known, key=lambda other: len(changed(other)))
        parts = [f"{k}: {closest.get(k, '-')!r} -> {variant.get(k, '-')!r}" for k in sorted(changed(closest))]
        return "It differs from the closest start-up variant in " + ("; ".join(parts) or "nothing visible")


_watch: CompileWatch | None = None


def watch() -> CompileWatch | None:
    """A start-up begins: install the process's CompileWatch as Triton's ``jit_cache_hook`` (once; it chains
    a hook installed before it) and stop warning until the next ``mark_serving()``. Returns the watch, or
    None when this Triton has no such hook (before 3.4)."""
    global _watch
    try:
        from triton import knobs
    except ImportError:
        return None
    if not hasattr(knobs, "runtime") or not hasattr(knobs.runtime, "jit_cache_hook"):
        return None
    if _watch is None or knobs.runtime.jit_cache_hook is not _watch:
        _watch = CompileWatch(previous=knobs.runtime.jit_cache_hook)
        knobs.runtime.jit_cache_hook = _watch
    _watch.serving = False
    return _watch


def mark_serving() -> None:
    """Start-up is over: every variant compiled from now on is logged as a WARNING (needs ``watch()``)."""
    if _watch is not None:
        _watch.serving = True
