"""The shape the sources keep (issue 21): files a newcomer can read whole and functions
that fit on a screen. The CLI's argument table is the one long function, a table by nature."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("privnet",)
MAX_FILE = 600  # lines
MAX_FUNCTION = 80  # lines, decorators and docstring included
TABLES = {("privnet/orchestrator/cli.py", "parser")}  # (file, function) allowed to be longer


def sources() -> list[Path]:
    return sorted(p for d in SOURCES for p in (ROOT / d).rglob("*.py"))


def test_no_source_file_is_over_600_lines() -> None:
    long = {
        p.relative_to(ROOT).as_posix(): n
        for p in sources()
        if (n := len(p.read_text().splitlines())) > MAX_FILE
    }
    assert long == {}, f"split these files (lines): {long}"


def test_no_function_is_over_80_lines() -> None:
    long = {}
    for path in sources():
        name = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > MAX_FUNCTION and (name, node.name) not in TABLES:
                    long[f"{name}:{node.name}"] = lines
    assert long == {}, f"break these functions into named steps (lines): {long}"


def test_the_limits_see_the_sources() -> None:
    """The walk above finds the packages (a moved tree would pass the limits vacuously)."""
    names = {p.relative_to(ROOT).as_posix() for p in sources()}
    assert {
        "privnet/agent/node.py",
        "privnet/orchestrator/api.py",
        "privnet/broker/embedded.py",
    } <= names
    assert len(names) > 80
