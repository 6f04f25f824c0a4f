"""The layering of privnet/: no module imports one that stands above it. The layers live in
docs/design/layers.toml, which the documentation's design page renders, so the page and
this test read one table; the import graph is tests/test_imports.py's (imports inside
functions and under TYPE_CHECKING count: a lazy import is still an import)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from test_imports import graph

LAYERS_FILE = Path(__file__).resolve().parent.parent / "docs" / "design" / "layers.toml"


@dataclass(frozen=True)
class Layering:
    """Layer names bottom first, each entry's layer, and the upward imports allowed."""

    names: list[str]
    entries: dict[str, int]  # "privnet.agent.spec" or "privnet.broker.*" -> layer index
    exceptions: set[tuple[str, str]]

    def layer_of(self, module: str) -> int | None:
        """The layer of the longest entry naming `module` (exact, or a package's subtree)."""
        best: tuple[int, int] | None = None
        for entry, index in self.entries.items():
            base = entry.removesuffix(".*")
            hit = module == base or (entry.endswith(".*") and module.startswith(base + "."))
            if hit and (best is None or len(base) > best[0]):
                best = (len(base), index)
        return None if best is None else best[1]


def load(path: Path = LAYERS_FILE) -> Layering:
    data = tomllib.loads(path.read_text())
    entries = {m: i for i, layer in enumerate(data["layer"]) for m in layer["modules"]}
    allowed = {(e["module"], e["imports"]) for e in data.get("exception", [])}
    return Layering([layer["name"] for layer in data["layer"]], entries, allowed)


def upward(edges: dict[str, set[str]], layering: Layering) -> list[str]:
    """Every import of a module above the importer's layer, not listed as an exception."""
    found = []
    for module in sorted(edges):
        here = layering.layer_of(module)
        for target in sorted(edges[module]):
            there = layering.layer_of(target)
            if (
                here is not None
                and there is not None
                and there > here
                and (module, target) not in layering.exceptions
            ):
                found.append(
                    f"{module} ({layering.names[here]}) imports {target} ({layering.names[there]})"
                )
    return found


def test_every_module_has_a_layer() -> None:
    layering = load()
    assert [m for m in graph() if layering.layer_of(m) is None] == []


def test_no_module_imports_one_above_it() -> None:
    assert upward(graph(), load()) == []


def test_every_entry_names_modules_that_exist() -> None:
    """A renamed module must be renamed here too, or the table would describe nothing."""
    modules = set(graph())
    layering = load()

    def names_some(entry: str) -> bool:
        base = entry.removesuffix(".*")
        return base in modules or (
            entry.endswith(".*") and any(m.startswith(base + ".") for m in modules)
        )

    stale = [e for e in layering.entries if not names_some(e)]
    assert stale == []
    assert all(a in modules and b in modules for a, b in layering.exceptions)


def test_the_check_finds_an_upward_import() -> None:
    """The report's old import of the CLI's print_error, put back, is found."""
    layering = load()
    edges = graph()
    edges["privnet.orchestrator.report"] |= {"privnet.orchestrator.flags"}
    assert upward(edges, layering) == [
        "privnet.orchestrator.report (analysis) imports privnet.orchestrator.flags "
        "(command line and face)"
    ]
    bottom = Layering(["low", "high"], {"a.*": 0, "a.b": 1}, set())
    assert bottom.layer_of("a.b") == 1 and bottom.layer_of("a.c.d") == 0
    assert upward({"a.c": {"a.b"}, "a.b": {"a.c"}}, bottom) == ["a.c (low) imports a.b (high)"]
