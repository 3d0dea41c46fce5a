"""The code stays easy to walk through: no module of ``core/brigade`` over 500 lines, and no function over 60 in
the core or in any plugin package (``builtin_*/``, ``plugins/``), Triton kernels (``@triton.jit``) aside."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "core" / "brigade"
PACKAGE_ROOTS = [CORE, *sorted(ROOT.glob("builtin_*")), ROOT / "plugins"]
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules(root: Path = CORE) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _is_triton_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """``@triton.jit`` or ``@triton.jit(...)``, and ``@triton.autotune(...)`` stacked on one: device code whose
    body is one kernel, not a host function to split."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target) in ("triton.jit", "triton.autotune", "jit"):
            return True
    return False


def test_no_core_module_is_over_500_lines():
    big = [f"{p.relative_to(CORE)}: {n} lines" for p in _modules()
           if (n := p.read_text().count("\n")) > MAX_MODULE_LINES]
    assert not big, "split these modules by concept:\n" + "\n".join(big)


def test_no_function_is_over_60_lines():
    long = []
    for root in PACKAGE_ROOTS:
        for path in _modules(root):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_triton_kernel(node):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not long, "split these functions into named helpers:\n" + "\n".join(long)
