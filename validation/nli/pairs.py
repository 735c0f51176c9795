"""Load NLI pairs (premise, hypothesis, label) from JSONL or TSV, in our field names or SNLI/MNLI ones.

Our names: `id, premise, hypothesis, label, split`. SNLI/MNLI names: `sentence1, sentence2,
gold_label` with `pairID` (else `promptID`) as the id. A gold label of `-` means the annotators
did not agree: the row is unlabelled, dropped and counted (`NliLoad.dropped_unlabelled`) so the
caller can say how many. Any other label outside entailment / neutral / contradiction, a
missing field or an empty text is refused with the file and line. Rows without an id get
`{file stem}-{line}`. Other fields (SNLI parses, MNLI genre, our domain notes) are ignored.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shiplift.tasks.errors import BadInput, NotFound
from shiplift.tasks.hashing import sha256_file
from shiplift.validation.jsonl import jsonl_values

LABELS = ("entailment", "neutral", "contradiction")
RESERVE_SPLIT = "reserve"  # held back for a gate's extension (validation.extension): no gate's first look, no training
UNLABELLED = "-"
JSONL_SUFFIXES = (".jsonl",)
TSV_SUFFIXES = (".tsv", ".txt")
_ID_FIELDS = ("id", "pairID", "promptID")
_PREMISE_FIELDS = ("premise", "sentence1")
_HYPOTHESIS_FIELDS = ("hypothesis", "sentence2")
_LABEL_FIELDS = ("label", "gold_label")
_FIX = (
    "give every row a premise (or sentence1), a hypothesis (or sentence2) and a label (or gold_label) "
    f"in {list(LABELS)}; '-' marks an unlabelled row"
)

NliLabel = Literal["entailment", "neutral", "contradiction"]


class NliPair(BaseModel):
    """One labelled premise/hypothesis pair."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    premise: str = Field(min_length=1)
    hypothesis: str = Field(min_length=1)
    label: NliLabel
    split: str | None = None


class NliLoad(BaseModel):
    """The labelled pairs of one file, how many unlabelled rows were dropped, and the file's pin."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pairs: list[NliPair]
    dropped_unlabelled: int
    path: str
    sha256: str


def _pick(record: Mapping[str, Any], names: tuple[str, ...], where: str) -> Any:
    """The value under the first present name; two names with different values are ambiguous."""
    present = [(name, record[name]) for name in names if name in record and record[name] is not None]
    if len({json.dumps(value, sort_keys=True) for _, value in present}) > 1:
        raise BadInput(
            f"{where}: fields {[name for name, _ in present]} disagree: {dict(present)}",
            fix=f"keep one of {list(names)} per row",
        )
    return present[0][1] if present else None


def _text(record: Mapping[str, Any], names: tuple[str, ...], where: str) -> str:
    value = _pick(record, names, where)
    if value is None:
        raise BadInput(f"{where}: missing field {' / '.join(names)}", fix=_FIX)
    if not isinstance(value, str):
        raise BadInput(f"{where}: field {names[0]} is {type(value).__name__}, expected text", fix=_FIX)
    if not value.strip():
        raise BadInput(f"{where}: field {' / '.join(names)} is empty", fix="remove the row or fill in the text")
    return value


def _pair(record: Mapping[str, Any], where: str, default_id: str) -> NliPair | None:
    """The row as a pair, or None for an unlabelled ('-') row."""
    label = _pick(record, _LABEL_FIELDS, where)
    if label is None:
        raise BadInput(f"{where}: missing field label / gold_label", fix=_FIX)
    if label == UNLABELLED:
        return None
    if label not in LABELS:
        raise BadInput(f"{where}: label {label!r} is not one of {list(LABELS)}", fix=_FIX)
    ident = next((record[name] for name in _ID_FIELDS if record.get(name) is not None), None)  # first wins
    if isinstance(ident, bool) or not isinstance(ident, str | int | type(None)) or ident == "":
        raise BadInput(f"{where}: id {ident!r} is not a non-empty string or integer", fix="fix or remove the id")
    split = record.get("split")
    if split is not None and (not isinstance(split, str) or not split.strip()):
        raise BadInput(f"{where}: split {split!r} is not a non-empty string", fix="fix or remove the split")
    return NliPair(
        id=default_id if ident is None else str(ident),
        premise=_text(record, _PREMISE_FIELDS, where),
        hypothesis=_text(record, _HYPOTHESIS_FIELDS, where),
        label=label,
        split=split,
    )


def _jsonl_records(path: Path):
    for lineno, record in jsonl_values(path):
        if not isinstance(record, dict):
            raise BadInput(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}", fix=_FIX)
        yield lineno, record


def _tsv_records(path: Path):
    """Tab-separated rows under a header line; no quoting (as SNLI/MNLI ship them)."""
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if not header:
            raise BadInput(f"{path}: no header line", fix="start the file with tab-separated column names")
        for row in reader:
            lineno = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise BadInput(
                    f"{path}:{lineno}: {len(row)} columns but the header has {len(header)}",
                    fix="use exactly one tab between columns and no tabs or newlines inside texts",
                )
            yield lineno, dict(zip(header, row, strict=True))


def load_nli(path: str | Path) -> NliLoad:
    """Read an NLI file (.jsonl, or .tsv/.txt with a header); refuse bad rows, count unlabelled ones."""
    path = Path(path)
    if not path.is_file():
        raise NotFound(f"NLI file {path} does not exist", fix="pass the path of a .jsonl or .tsv NLI file")
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        records = _jsonl_records(path)
    elif suffix in TSV_SUFFIXES:
        records = _tsv_records(path)
    else:
        raise BadInput(
            f"NLI file {path} has suffix {suffix!r}",
            fix=f"use JSONL ({', '.join(JSONL_SUFFIXES)}) or TSV ({', '.join(TSV_SUFFIXES)})",
        )
    pairs: list[NliPair] = []
    dropped = 0
    for lineno, record in records:
        pair = _pair(record, f"{path}:{lineno}", f"{path.stem}-{lineno}")
        if pair is None:
            dropped += 1
        else:
            pairs.append(pair)
    if not pairs:
        raise BadInput(
            f"NLI file {path} has no labelled pairs ({dropped} unlabelled row(s) dropped)",
            fix="pass a file with labelled pairs",
        )
    return NliLoad(pairs=pairs, dropped_unlabelled=dropped, path=str(path), sha256=sha256_file(path))
