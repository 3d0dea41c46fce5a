"""The core stays easy to walk through: no module of ``core/brigade`` over 500 lines, no function over 60."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "core" / "brigade"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def test_no_core_module_is_over_500_lines():
    big = [f"{p.relative_to(CORE)}: {n} lines" for p in _modules()
           if (n := p.read_text().count("\n")) > MAX_MODULE_LINES]
    assert not big, "split these modules by concept:\n" + "\n".join(big)


def test_no_core_function_is_over_60_lines():
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(CORE)}:{node.lineno} {node.name}: {length} lines")
    assert not long, "split these functions into named helpers:\n" + "\n".join(long)
