"""MkDocs hooks (mkdocs.yml `hooks:`): the pages made from the code. `docs/reference/cli.md`
is rendered from `privnet.orchestrator.cli.parser()`, every subcommand's usage and flags with
their help. The site always gets the page rendered at build time; the copy kept in the
repository (so that the page reads on GitHub too) must equal it, or the strict build fails
naming it: `python scripts/docs_hooks.py` writes it again. The layering page's table is
rendered from `docs/design/layers.toml`, the file tests/test_layers.py checks the import
graph against.
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


def cli_page() -> str:
    """The page for the parser as it is now (looked up at call time, so a test's patch of
    `cli.parser` shows)."""
    if str(ROOT) not in sys.path:  # mkdocs run from the checkout without PYTHONPATH
        sys.path.insert(0, str(ROOT))
    from privnet.orchestrator import cli

    if not Path(cli.__file__).resolve().is_relative_to(ROOT):
        raise RuntimeError(
            f"the CLI reference would describe {cli.__file__}, not this checkout's: build "
            f"with PYTHONPATH={ROOT} or pip install -e {ROOT}"
        )
    return render_cli(cli.parser())


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
    """Put the layering table where the layering page marks it."""
    if LAYERS_MARK in markdown:
        return markdown.replace(LAYERS_MARK, render_layers())
    return markdown


if __name__ == "__main__":
    (ROOT / "docs" / CLI_PAGE).write_text(cli_page())
    print(f"wrote docs/{CLI_PAGE}")
