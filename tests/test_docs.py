"""The documentation site (mkdocs.yml, docs/): it builds strictly, the CLI reference is the
parser's (a flag's help changed is a page changed), the layering page shows
docs/design/layers.toml, the control plane page the agent's transition table, every command
marked runnable in a page runs, and the README is a landing page: short, its quick start
near the top, its links pointing at pages that exist."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARK = "<!-- runnable -->"
BUDGET = 60.0  # seconds a runnable block may take on a busy 2-core machine
CHANGED_FLAG = "--agents-per-process"
CHANGED_HELP = "help changed by tests/test_docs.py"


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts/docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str


def runnable_blocks(text: str, page: str) -> list[Block]:
    """The fenced blocks right after a `<!-- runnable -->` line."""
    lines = text.split("\n")
    found = []
    for i, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        opening = lines[i + 1] if i + 1 < len(lines) else ""
        fence = re.match(r"^```(\w+)", opening)
        if fence is None:
            raise AssertionError(f"{page}:{i + 1}: {MARK} must be followed by a fenced block")
        end = lines.index("```", i + 2)
        found.append(Block(page, i + 2, fence.group(1), "\n".join(lines[i + 2 : end])))
    return found


def all_runnable() -> list[Block]:
    return [
        block
        for path in sorted(DOCS.rglob("*.md"))
        for block in runnable_blocks(path.read_text(), str(path.relative_to(ROOT)))
    ]


def shim(directory: Path) -> dict[str, str]:
    """An environment where `privnet` is this interpreter running this checkout's privnet."""
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    command = bin_dir / "privnet"
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m privnet "$@"\n')
    command.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return env


@pytest.mark.parametrize("block", all_runnable(), ids=lambda b: f"{b.page}:{b.line}")
def test_a_runnable_block_runs(block: Block, tmp_path: Path) -> None:
    env = shim(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    if block.language == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    else:
        assert block.language == "python", f"{block.page}:{block.line}: bash or python"
        argv = [sys.executable, "-c", block.code]
    start = time.monotonic()
    done = subprocess.run(
        argv, cwd=work, env=env, capture_output=True, text=True, timeout=BUDGET, check=False
    )
    assert done.returncode == 0, f"{block.page}:{block.line}\n{done.stdout}\n{done.stderr}"
    assert time.monotonic() - start < BUDGET


def test_the_runnable_marker_is_found_and_checked() -> None:
    blocks = all_runnable()
    assert {b.language for b in blocks} == {"bash", "python"}
    assert any("privnet simulate" in b.code for b in blocks)
    with pytest.raises(AssertionError, match="must be followed by a fenced block"):
        runnable_blocks(f"{MARK}\nprivnet --version\n", "page.md")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The site built from this checkout: strictly first, as scripts/check builds it."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    out = tmp_path_factory.mktemp("site")
    build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(out), strict=True))
    yield out


def changed_parser(original: Callable[[], argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The CLI's parser with one flag's help text changed."""
    made = original()
    run = next(sub for name, _, sub in hooks().subcommands(made) if name == "run")
    for action in run._actions:
        if CHANGED_FLAG in action.option_strings:
            action.help = CHANGED_HELP
            return made
    raise AssertionError(f"privnet run has no {CHANGED_FLAG}")


def test_the_cli_reference_follows_the_parser(
    site: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    from privnet.orchestrator import cli

    kept = (DOCS / "reference" / "cli.md").read_text()
    assert kept == hooks().cli_page()  # the copy GitHub shows is the parser's
    page = (site / "reference" / "cli" / "index.html").read_text()
    assert CHANGED_FLAG in page and CHANGED_HELP not in page
    commands = [name for name, _, _ in hooks().subcommands(cli.parser())]
    assert len(commands) >= 10
    assert all(f'id="{name}"' in page for name in commands)

    original = cli.parser
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "parser", lambda: changed_parser(original))
        with pytest.raises(Abort):  # the kept copy is stale now: the strict build says so
            build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path / "a"), strict=True))
        assert "docs/reference/cli.md is stale" in caplog.text
        build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path / "b"), strict=False))
    changed = (tmp_path / "b" / "reference" / "cli" / "index.html").read_text()
    assert CHANGED_HELP in changed
    assert changed.replace(CHANGED_HELP, "") != page.replace(CHANGED_HELP, "")


def test_the_layering_page_is_layers_toml(site: Path) -> None:
    page = (site / "design" / "layering" / "index.html").read_text()
    layers = tomllib.loads((DOCS / "design" / "layers.toml").read_text())["layer"]
    assert "<!-- layers.toml -->" not in page
    for layer in layers:
        assert f"<td>{layer['name']}</td>" in page
        assert f"<code>{layer['modules'][0]}</code>" in page


def test_the_life_cycle_is_the_transition_table(
    site: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The control plane page draws privnet.agent.phases.TRANSITIONS: its kept copy is the
    hook's rendering, the site shows it as a mermaid diagram with every move, and a stale
    copy is a warning (a failed strict build) naming the page."""
    from privnet.agent.phases import TRANSITIONS, Trigger

    docs = hooks()
    markdown = (DOCS / docs.PHASES_PAGE).read_text()
    kept = docs.kept_phases(markdown)
    assert kept is not None and kept == docs.render_phases()
    page = (site / "design" / "control-plane" / "index.html").read_text()
    assert '<pre class="mermaid"><code>stateDiagram-v2' in page
    for phase, moves in TRANSITIONS.items():
        for trigger, to in moves.items():
            if trigger is not Trigger.FAILURE:
                assert f"{phase.name} --&gt; {to.name}: " in page
            assert f"{trigger.value} → <code>{to.name}</code>" in page

    class Page:  # what the hook reads of mkdocs' page
        class file:
            src_uri = docs.PHASES_PAGE

    stale = markdown.replace("KEYED --> RUNNING: Go", "KEYED --> FINISHED: Go")
    assert docs.on_page_markdown(stale, Page, None, None) == docs.with_phases(markdown)
    assert f"the life cycle in docs/{docs.PHASES_PAGE} is stale" in caplog.text


def test_the_api_reference_documents_the_public_names(site: Path) -> None:
    page = (site / "reference" / "api" / "index.html").read_text()
    for name in (
        "Experiment",
        "simulate",
        "run_async",
        "Result",
        "RunFailed",
        "ConfigError",
        "Dataset",
        "LeastSquares",
        "Logistic",
        "Problem",
        "Risk",
        "TorchProblem",
    ):
        assert re.search(rf'id="privnet\.[\w.]*\.{name}"', page), name


def test_the_readme_is_a_landing_page() -> None:
    readme = (ROOT / "README.md").read_text().split("\n")
    assert len(readme) <= 200
    top = "\n".join(readme[:40])
    assert "pip install -e . && privnet run" in top
    assert "bash scripts/test" in top
    assert "mkdocs serve" in "\n".join(readme)
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", "\n".join(readme))
    local = [link for link in links if not link.startswith("http")]
    assert len(local) >= 10
    assert [link for link in local if not (ROOT / link).exists()] == []
