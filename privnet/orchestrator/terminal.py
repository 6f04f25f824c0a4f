"""Where the orchestrator's words go: messages and progress to stderr, one line each;
tables to stdout, wide enough when piped. Every command prints through these.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

PIPED_WIDTH = 160  # columns for tables on a pipe or file, where rich would assume 80


console = Console(stderr=True, soft_wrap=True)  # progress, messages (one line each); tables: stdout


def table_console() -> Console:
    """Where tables go: stdout, at the terminal's width or, piped (CI logs, tee), wide
    enough that rich does not cut the overhead table's 14 columns to ellipses."""
    console = Console()
    return console if console.is_terminal else Console(width=PIPED_WIDTH)


def narrow_table(title: str, caption: str | None = None) -> Table:
    """A table for an 80-column terminal: rules under the header only, no outer padding;
    cells wrap (`overflow="fold"` on columns), never cut."""
    return Table(
        title=title,
        caption=caption,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
        caption_justify="left",
    )


def titled_table(title: str, columns: Iterable[str], left: int = 1) -> Table:
    """A table whose first `left` columns are names (left) and the rest numbers (right)."""
    table = Table(title=title)
    for n, name in enumerate(columns):
        table.add_column(name, justify="left" if n < left else "right")
    return table


def progress_bar() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
    )


def print_error(message: str) -> None:
    """A user error, on one line of stderr, whatever the terminal's width or --quiet."""
    from rich.text import Text

    quiet, console.quiet = console.quiet, False
    try:  # as Text: a message's brackets (privnet[docker]) are not markup
        console.print(Text.assemble(("error: ", "red"), message), soft_wrap=True)
    finally:
        console.quiet = quiet
    sys.stderr.flush()
