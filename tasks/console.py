"""What the command line shows people: plain text tables fitted to the terminal, (field, value) tables of nested
data, JSON for machines, and the exit codes every command keeps.

Below everything else (it imports only the standard library), so a model family's own `serve` and `eval` commands
print and exit as the `shiplift` commands do without importing the CLI.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Callable
from typing import Any

EXIT_ERROR, EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_LEASE, EXIT_AWAITING = 1, 2, 3, 4, 5
EXIT_BROKEN_PIPE = 141  # as a shell reports a writer ended by SIGPIPE
SHORTENED_MARK = "…"  # where a fitted cell cut the middle of a value (`gemma-…3d396`); ids typed so still resolve
MIN_CELL = 12  # the narrowest a shrinkable column gets when a table is fitted to the terminal


def print_json(value) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def number(value) -> str:
    """A number for people: floats to 4 significant digits (0.3063, never 0.3063063063063063), integers whole."""
    if value is None:
        return "n/a"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def cell(value) -> str | None:
    """A value as one table cell: None stays None (shown '-'), floats rounded (`number`), a list of plain values
    joined with commas, anything nested as compact JSON."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return number(value)
    if isinstance(value, list) and all(v is None or isinstance(v, (str, int, float)) for v in value):
        return ", ".join("-" if v is None else cell(v) for v in value)
    if measured(value):
        ci = value.get("ci")
        return number(value["value"]) + (f" [{number(ci[0])}, {number(ci[1])}]" if ci else "")
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str)


def measured(value) -> bool:
    """A measurement as the gate reports it: {"value", "ci": [lo, hi] or None, ...}; one cell, `value [lo, hi]`."""
    return isinstance(value, dict) and "value" in value and "ci" in value and not isinstance(value["value"],
                                                                                             (dict, list))


def fit_cell(text: str, width: int) -> list[str]:
    """A cell in at most `width` characters: as it is; one token (a hash, a digest, a URI) shortened with an
    ellipsis in the middle, where its two ends still tell it apart; text wrapped over several lines."""
    if len(text) <= width:
        return [text]
    if " " not in text.strip():
        keep = width - 1
        return [text[:(keep + 1) // 2] + SHORTENED_MARK + text[len(text) - keep // 2:]]
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def terminal_width() -> int:
    """The terminal's columns ($COLUMNS, else the terminal's, else 80)."""
    return shutil.get_terminal_size((80, 24)).columns


def format_table(rows: list[dict], columns: list[str], *, width: int | None = None,
                 shrink: tuple[str, ...] = ()) -> str:
    """A plain text table for people: a header, a rule, a line a row, columns padded to their widest cell; a value
    that is not there (None) shows as '-'. With `width`, the `shrink` columns are narrowed (the widest first, to no
    less than MIN_CELL or their header) until the table fits, their long cells shortened or wrapped (`fit_cell`):
    every row is still there."""
    cells = [["-" if row.get(column) is None else str(row.get(column)) for column in columns] for row in rows]
    widths = [max([len(column), *(len(line[i]) for line in cells)]) for i, column in enumerate(columns)]
    if width is not None:
        gaps = 2 * (len(columns) - 1)
        floors = {i: max(len(columns[i]), MIN_CELL) for i, column in enumerate(columns) if column in shrink}
        while sum(widths) + gaps > width:
            narrowable = [i for i, floor in floors.items() if widths[i] > floor]
            if not narrowable:
                break
            widths[max(narrowable, key=lambda i: widths[i])] -= 1
    lines = []
    for line in [columns, ["-" * w for w in widths], *cells]:
        parts = [fit_cell(value, w) for value, w in zip(line, widths, strict=True)]
        for k in range(max(len(part) for part in parts)):
            lines.append("  ".join((part[k] if k < len(part) else "").ljust(w)
                                   for part, w in zip(parts, widths, strict=True)).rstrip())
    return "\n".join(lines)


def print_table(rows: list[dict], columns: list[str], *, shrink: tuple[str, ...] = ()) -> None:
    """A table for people on stdout (`--json` prints the rows for machines instead); with `shrink`, fitted to the
    terminal's width by narrowing those columns."""
    print(format_table(rows, columns, width=terminal_width() if shrink else None, shrink=shrink))


def flatten(value: Any, prefix: str = "", *, whole: Callable[[Any], bool] = lambda value: False) -> dict[str, Any]:
    """Leaves of nested dicts as dotted keys, under `prefix` (lists, and dicts `whole` says to keep, stay whole: they
    are compared and shown as values)."""
    if not isinstance(value, dict) or whole(value):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, inner in value.items():
        flat.update(flatten(inner, f"{prefix}.{key}" if prefix else str(key), whole=whole))
    return flat


def print_fields(values: dict, column: str = "field") -> None:
    """A (field, value) table of a dict for people, nested fields one row each (`metrics.accuracy`), numbers
    rounded, fitted to the terminal's width."""
    print_table([{column: name, "value": cell(value)} for name, value in flatten(values, whole=measured).items()],
                [column, "value"],
                shrink=("value",))
