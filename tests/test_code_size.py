"""Every module of seq2seq/ reads in one sitting and every function on one screen or two: at most
450 lines a module, 80 a function (from its ``def`` line to its last, decorators aside)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "seq2seq"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def modules() -> dict[str, str]:
    """The package's modules by path under seq2seq/: their text."""
    paths = sorted(PACKAGE.rglob("*.py"))
    return {p.relative_to(PACKAGE).as_posix(): p.read_text(encoding="utf-8") for p in paths}


def test_no_module_is_over_450_lines():
    sizes = {name: len(text.splitlines()) for name, text in modules().items()}
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_function_is_over_80_lines():
    long = {}
    for name, text in modules().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{name}:{node.name}"] = lines
    assert long == {}
