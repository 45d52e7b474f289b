"""The size limits the architecture holds to (docs/architecture.md): no module of pitstop over 500 lines,
no function over 80 and no package with more than 20 modules of its own, so a module keeps one job, a
function one stage and a folder one part of the design. A module or function that
grows past them is split along its real seams (see the layering contracts in pyproject.toml for where
a split-off piece may go)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "pitstop"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_PACKAGE_MODULES = 20


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_module_over_500_lines():
    long = {
        str(p.relative_to(SRC)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_over_80_lines():
    long = []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(SRC)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_package_over_20_modules():
    big = {
        str(d.relative_to(SRC.parent)): n
        for d in [SRC, *(p.parent for p in SRC.rglob("__init__.py"))]
        if (n := len(list(d.glob("*.py")))) > MAX_PACKAGE_MODULES
    }
    assert not big, f"packages with over {MAX_PACKAGE_MODULES} modules: {big}"
