"""Reading back the tables `warren` prints off a terminal (server/cli_tables.py): a heading
line, a rule, then a line per row, each column starting where its heading does."""

from __future__ import annotations

import re

RULE = "─"
# Headings are a word or words one space apart; columns are two or more spaces apart.
HEADING = re.compile(r"\S+(?: \S+)*")

Printed = tuple[list[str], list[dict[str, str]]]


def printed_tables(out: str) -> list[Printed]:
    """Each table in `out` (tables are blank lines apart) as its headings and its rows, each
    row {heading: cell}; cells are cut at the headings' columns, so an empty cell reads ""."""
    tables = []
    for block in re.split(r"\n\s*\n", out.strip("\n")):
        heading_line, rule, *lines = block.splitlines()
        assert set(rule.strip()) == {RULE}, f"no rule under the headings: {rule!r}"
        found = list(HEADING.finditer(heading_line))
        ends = [heading.start() for heading in found[1:]] + [None]
        rows = [
            {
                heading.group(): line[heading.start() : end].strip()
                for heading, end in zip(found, ends, strict=True)
            }
            for line in lines
        ]
        tables.append(([heading.group() for heading in found], rows))
    return tables
