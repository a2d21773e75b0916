"""How `warren` commands that act on a running broker print: a table for people (rich), or
with `--json` the API's own JSON for scripts.

Off a terminal (a pipe, a file) the table keeps its natural width and no colours, so grep
and less see whole rows.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

# (heading, key in the API's object)
Columns = Sequence[tuple[str, str]]
# Wide enough for any row a broker lists; a table never stretches beyond its content.
PIPE_WIDTH = 100_000


def console() -> Console:
    terminal = sys.stdout.isatty()
    return Console(
        file=sys.stdout,
        width=None if terminal else PIPE_WIDTH,
        highlight=False,
        no_color=not terminal,
    )


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def print_table(columns: Columns, rows: Sequence[dict[str, Any]]) -> None:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for heading, _ in columns:
        table.add_column(heading, overflow="fold")
    for row in rows:
        table.add_row(*(cell(row.get(key)) for _, key in columns))
    console().print(table)


def print_fields(fields: Columns, item: dict[str, Any]) -> None:
    """One object as a two-column table: a heading and its value per line."""
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for heading, key in fields:
        table.add_row(heading, cell(item.get(key)))
    console().print(table)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))
