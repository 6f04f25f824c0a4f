"""MkDocs hooks (mkdocs.yml `hooks:`): the pages made from the code. `docs/reference/cli.md`
is rendered from `privnet.orchestrator.cli.parser()`, every subcommand's usage and flags with
their help. The site always gets the page rendered at build time; the copy kept in the
repository (so that the page reads on GitHub too) must equal it, or the strict build fails
naming it: `python scripts/docs_hooks.py` writes it again. The layering page's table is
rendered from `docs/design/layers.toml`, the file tests/test_layers.py checks the import
graph against. The agent's life cycle in `docs/design/control-plane.md` (a mermaid diagram
and a table) is rendered from `privnet.agent.phases.TRANSITIONS`, the table the node checks
every move against; the page keeps a copy between two marks, which must equal it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOG = logging.getLogger("mkdocs.hooks.privnet")  # under "mkdocs": a warning fails --strict
LAYERS = ROOT / "docs" / "design" / "layers.toml"
CLI_PAGE = "reference/cli.md"
LAYERS_MARK = "<!-- layers.toml -->"
PHASES_PAGE = "design/control-plane.md"
PHASES_BEGIN = "<!-- rendered from privnet.agent.phases.TRANSITIONS (scripts/docs_hooks.py) -->"
PHASES_END = "<!-- /phases -->"
USAGE_WIDTH = 72  # fits the Material theme's content column


def cell(text: str) -> str:
    """Text fit for one cell of a Markdown table: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def expanded_help(action: argparse.Action, prog: str) -> str:
    """An action's help as `--help` prints it (`%(default)s` and co. filled in)."""
    text = action.help or ""
    if "%" in text:
        fields = {**vars(action), "prog": prog}
        fields.update({k: getattr(v, "__name__", v) for k, v in fields.items() if callable(v)})
        text = text % fields
    return text


def flag_row(action: argparse.Action, prog: str) -> str | None:
    """One flag as a table row: its spellings and value, what it does, its default."""
    if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
        return None
    names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
    if action.nargs != 0:
        if action.choices is not None:
            value = "{" + ",".join(str(c) for c in action.choices) + "}"
        else:
            value = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        names += f" `{value}`"
    default = action.default
    shown = (
        "" if default in (None, False, argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
    )
    return f"| {cell(names)} | {cell(expanded_help(action, prog))} | {cell(shown)} |"


def flags_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = [r for a in parser._actions if (r := flag_row(a, parser.prog)) is not None]
    if not rows:
        return []
    return ["| flag | what | default |", "|---|---|---|", *rows, ""]


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, Any]]:
    """(name, one-line help, parser) of every subcommand, in the table's order."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            found += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return found


def usage(parser: argparse.ArgumentParser) -> str:
    """The usage lines at a fixed width, whatever terminal builds the site."""
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def render_cli(parser: argparse.ArgumentParser) -> str:
    """The CLI reference page: the top-level usage and flags, then each subcommand's."""
    out = [
        "# Command-line reference",
        "",
        "Generated from `privnet.orchestrator.cli.parser()`, the argument table `privnet` "
        "itself parses with, each time the site is built (`scripts/docs_hooks.py`): what "
        "`privnet COMMAND --help` prints, as tables.",
        "",
        "```",
        usage(parser),
        "```",
        "",
        *flags_table(parser),
        "| command | what |",
        "|---|---|",
    ]
    commands = subcommands(parser)
    out += [f"| [`{name}`](#{name}) | {cell(text)} |" for name, text, _ in commands]
    out.append("")
    for name, text, sub in commands:
        out += [f"## {name}", "", cell(text) or cell(sub.description or ""), ""]
        out += ["```", usage(sub), "```", "", *flags_table(sub)]
    return "\n".join(out).rstrip() + "\n"


def this_checkout(module: Any) -> Any:
    """`module`, once it is sure to be this checkout's (not another install's)."""
    if not Path(module.__file__).resolve().is_relative_to(ROOT):
        raise RuntimeError(
            f"the docs would describe {module.__file__}, not this checkout's: build "
            f"with PYTHONPATH={ROOT} or pip install -e {ROOT}"
        )
    return module


def cli_page() -> str:
    """The page for the parser as it is now (looked up at call time, so a test's patch of
    `cli.parser` shows)."""
    if str(ROOT) not in sys.path:  # mkdocs run from the checkout without PYTHONPATH
        sys.path.insert(0, str(ROOT))
    from privnet.orchestrator import cli

    return render_cli(this_checkout(cli).parser())


def render_phases() -> str:
    """The agent's transition table as a mermaid state diagram (failure edges left out:
    any phase but a final one can fail, which the table below it says) and a table."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from privnet.agent import phases

    table = this_checkout(phases).TRANSITIONS
    edges: dict[tuple[str, str], list[str]] = {}
    for phase, moves in table.items():
        for trigger, to in moves.items():
            if trigger is not phases.Trigger.FAILURE:
                edges.setdefault((phase.name, to.name), []).append(trigger.value)
    out = [PHASES_BEGIN, "```mermaid", "stateDiagram-v2", f"    [*] --> {phases.INITIAL.name}"]
    out += [f"    {a} --> {b}: {' / '.join(labels)}" for (a, b), labels in edges.items()]
    out += [f"    {phase.name} --> [*]" for phase in phases.FINAL]
    out += ["```", "", "| phase | moved on by |", "|---|---|"]
    for phase, moves in table.items():
        cells = "; ".join(f"{t.value} → `{to.name}`" for t, to in moves.items())
        out.append(f"| `{phase.name}` | {cell(cells) or 'nothing (final)'} |")
    return "\n".join([*out, "", PHASES_END])


def kept_phases(markdown: str) -> str | None:
    """The copy of `render_phases()` a page keeps (None: it keeps none)."""
    if PHASES_BEGIN not in markdown or PHASES_END not in markdown:
        return None
    start = markdown.index(PHASES_BEGIN)
    return markdown[start : markdown.index(PHASES_END, start) + len(PHASES_END)]


def with_phases(markdown: str) -> str:
    """`markdown` with its kept copy of the life cycle rendered again."""
    kept = kept_phases(markdown)
    return markdown if kept is None else markdown.replace(kept, render_phases())


def render_layers(path: Path = LAYERS) -> str:
    """docs/design/layers.toml as a table, bottom layer first, and its exceptions."""
    data = tomllib.loads(path.read_text())
    out = ["| # | layer | modules | why |", "|---|---|---|---|"]
    for index, layer in enumerate(data["layer"]):
        modules = ", ".join(f"`{m}`" for m in layer["modules"])
        out.append(f"| {index} | {layer['name']} | {cell(modules)} | {cell(layer['why'])} |")
    exceptions = data.get("exception", [])
    out += ["", "Allowed upward imports: " + ("none." if not exceptions else "")]
    out += [f"- `{e['module']}` imports `{e['imports']}`: {e['why']}" for e in exceptions]
    return "\n".join(out) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """The CLI reference as the parser renders it now; a warning if the kept copy differs."""
    from mkdocs.structure.files import File

    page = cli_page()
    kept = files.get_file_from_path(CLI_PAGE)
    if kept is None or Path(kept.abs_src_path).read_text() != page:
        LOG.warning(
            "docs/%s is stale (the CLI's arguments changed): run `python scripts/docs_hooks.py`",
            CLI_PAGE,
        )
    if kept is not None:
        files.remove(kept)
    files.append(File.generated(config, CLI_PAGE, content=page))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Put the layering table where the layering page marks it; the life cycle as the
    transition table renders it now, and a warning if the page's copy differs."""
    if LAYERS_MARK in markdown:
        markdown = markdown.replace(LAYERS_MARK, render_layers())
    kept = kept_phases(markdown)
    if kept is not None and kept != render_phases():
        LOG.warning(
            "the life cycle in docs/%s is stale (privnet.agent.phases.TRANSITIONS changed): "
            "run `python scripts/docs_hooks.py`",
            page.file.src_uri,
        )
    return with_phases(markdown)


if __name__ == "__main__":
    (ROOT / "docs" / CLI_PAGE).write_text(cli_page())
    print(f"wrote docs/{CLI_PAGE}")
    page = ROOT / "docs" / PHASES_PAGE
    page.write_text(with_phases(page.read_text()))
    print(f"wrote the life cycle in docs/{PHASES_PAGE}")
