"""The import graph of the sources: no module reaches itself through imports, counting the
imports made inside functions and under TYPE_CHECKING (a circle held together by a
function-local import is still a circle), and the orchestrator's conductor takes the
protocol's vocabulary from `privnet.agent.protocol`, not from the agent's state machine."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("privnet",)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports anywhere in it: `from pkg import mod` names the
    module where there is one, else the package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module in known:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while (w := stack.pop()) != v:
                part.append(w)
            if part:
                found.append(sorted([v, *part]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def graph() -> dict[str, set[str]]:
    files = sources()
    known = set(files)
    return {name: imports(path, known) - {name} for name, path in files.items()}


def test_no_module_reaches_itself_through_imports() -> None:
    assert circles(graph()) == []


def test_the_finder_finds_a_circle_and_only_it() -> None:
    made = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(made) == [["a", "b", "c"]]


def test_the_conductor_does_not_import_the_agents_state_machine() -> None:
    reached, todo = set(), ["privnet.orchestrator.conductor"]
    edges = graph()
    while todo:
        for w in edges[todo.pop()] - reached:
            reached.add(w)
            todo.append(w)
    assert "privnet.agent.protocol" in reached
    assert not {"privnet.agent.node", "privnet.agent.core"} & reached
