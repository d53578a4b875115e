"""Where output goes: data on stdout, messages and errors on stderr.

rich honours NO_COLOR and draws tables only on a terminal; piped output is plain."""

from __future__ import annotations

import json
import sys
from functools import cache
from typing import Any

from rich.console import Console


@cache
def out() -> Console:
    """Data: tables, JSON, YAML. Safe to pipe."""
    return Console(soft_wrap=True, highlight=False)


@cache
def err() -> Console:
    """Messages: progress, notes, errors."""
    return Console(stderr=True, soft_wrap=True, highlight=False)


def print_json(data: Any) -> None:
    """JSON on stdout, one document, no colour: for scripts and `jq`."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def note(message: str) -> None:
    err().print(message, markup=False)


def print_error(exc: BaseException) -> None:
    """`error: ...` on stderr. The message carries user values: never read it as markup."""
    if not err().is_terminal:
        sys.stderr.write(f"error: {exc}\n")
        return
    from rich.markup import escape

    err().print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)


Section = tuple[str, list[str], list[list[str]]]
"""A titled table: its title, its column names, its rows of cells."""


def print_sections(sections: list[Section]) -> None:
    """Titled tables on stdout: rich tables on a terminal, aligned plain text otherwise.
    A section without rows is left out."""
    if out().is_terminal:
        from rich.table import Table
        from rich.text import Text

        for title, columns, rows in sections:
            if not rows:
                continue
            table = Table(title=title, title_justify="left")
            for column in columns:
                table.add_column(column, overflow="fold")
            for row in rows:
                table.add_row(*(Text(cell) for cell in row))  # values, never markup
            out().print(table)
        return
    for title, columns, rows in sections:
        if not rows:
            continue
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        sys.stdout.write(f"\n{title}\n")
        for row in [columns, *rows]:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
            sys.stdout.write("  ".join(cells).rstrip() + "\n")
