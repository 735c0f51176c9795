"""Read JSONL datasets line by line with errors that name the file, line and column."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from shiplift.tasks.errors import BadInput


def jsonl_values(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line; invalid JSON is BadInput at path:line."""
    with open(path, encoding="utf-8") as handle:
        yield from parsed_lines(handle, str(path))


def parsed_lines(lines: Iterable[str], where: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank JSONL line read from `where`; invalid JSON is BadInput at
    where:line."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(
                f"{where}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno})",
                fix="write one JSON object per line",
            ) from None
        yield lineno, value
