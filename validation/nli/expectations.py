"""Great Expectations suite run on every NLI dataset before it is used.

Checks: at least one row, unique non-null ids, labels among entailment / neutral / contradiction,
non-empty premise and hypothesis. Also reports the label balance (overall and per split). Runs
on the same quiet, in-memory GX context as the decision suite (validation.expectations).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from shiplift.validation.expectations import DatasetCheck, add_suite, shared_context, validate_rows
from shiplift.validation.nli.pairs import LABELS, NliPair

SUITE_NAME = "shiplift-nli-dataset"
_COLUMNS = ("id", "label", "split", "premise", "hypothesis")
_nli: dict[str, Any] = {}


def _suite_and_batch_definition() -> tuple[Any, Any]:
    """The NLI suite and batch definition on the shared GX context, created on first use (called under the lock)."""
    if not _nli:
        import great_expectations as gx

        expect = gx.expectations
        suite, batch_definition = add_suite(shared_context(), "shiplift-nli", "nli_dataset", SUITE_NAME, [
            expect.ExpectTableRowCountToBeBetween(min_value=1),
            expect.ExpectColumnValuesToNotBeNull(column="id"),
            expect.ExpectColumnValuesToBeUnique(column="id"),
            expect.ExpectColumnValuesToBeInSet(column="label", value_set=list(LABELS)),
            expect.ExpectColumnValueLengthsToBeBetween(column="premise", min_value=1),
            expect.ExpectColumnValueLengthsToBeBetween(column="hypothesis", min_value=1),
        ])
        _nli.update(suite=suite, batch_definition=batch_definition)
    return _nli["suite"], _nli["batch_definition"]


def _row(pair: NliPair | Mapping[str, Any]) -> dict[str, Any]:
    record = pair.model_dump() if isinstance(pair, NliPair) else dict(pair)
    text = {key: record.get(key).strip() if isinstance(record.get(key), str) else ""
            for key in ("premise", "hypothesis")}
    ident = record.get("id")
    return {
        "id": ident if isinstance(ident, str) and ident else None,
        "label": None if record.get("label") is None else str(record.get("label")),
        "split": None if record.get("split") is None else str(record.get("split")),
        **text,
    }


def label_balance(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Label counts overall and per split, and the majority label's share (1/3 is perfectly balanced)."""
    by_label = Counter(str(r["label"]) for r in rows)
    by_split: dict[str, Counter] = {}
    for r in rows:
        by_split.setdefault(str(r["split"]), Counter())[str(r["label"])] += 1
    return {
        "by_label": dict(sorted(by_label.items())),
        "by_split_label": {split: dict(sorted(c.items())) for split, c in sorted(by_split.items())},
        "majority_share": round(max(by_label.values()) / len(rows), 4) if rows else None,
    }


def check_nli_pairs(pairs: Sequence[NliPair | Mapping[str, Any]], *, name: str) -> DatasetCheck:
    """Run the NLI suite; return the check, or raise BadInput naming every failed expectation.

    `pairs` are NliPairs or raw records in our field names. The raised error carries the
    DatasetCheck as `error.check` for evidence.
    """
    rows = [_row(pair) for pair in pairs]
    return validate_rows(
        rows, list(_COLUMNS), _suite_and_batch_definition, name=name, what="NLI dataset", balance=label_balance(rows),
        fix=f"fix the listed rows (unique non-empty ids, label in {list(LABELS)}, non-empty premise and hypothesis)",
    )
