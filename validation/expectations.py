"""Great Expectations suite run on every decision dataset before it is used.

Checks: at least one row, unique non-null ids, a known question type, 2-16 unique labels,
the expected label inside the labels, non-empty state and question text. Also reports the
label balance. Uses an ephemeral GX context (nothing written to disk), built once per
process; GX's loggers and progress bars are silenced.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shiplift.tasks.errors import BadInput
from shiplift.validation.decisions.jevbench import MAX_OPTIONS, MIN_OPTIONS, JevTask

SUITE_NAME = "shiplift-decision-dataset"
QUESTION_TYPES = ["choice", "noul", "score"]
SAMPLE_UNEXPECTED = 5
_NOISY_PREFIXES = ("great_expectations", "marshmallow")
_lock = threading.Lock()
_gx: dict[str, Any] = {}


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's verdict, with how many rows broke it and a few of their values."""

    expectation: str
    column: str | None
    success: bool
    unexpected_count: int
    sample_unexpected: list[Any]


@dataclass(frozen=True)
class DatasetCheck:
    """The result of checking one decision dataset: verdict, per-expectation results, balance."""

    name: str
    passed: bool
    row_count: int
    expectations: list[ExpectationOutcome]
    balance: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict for gate evidence."""
        return asdict(self)


def _quiet() -> None:
    """Silence GX: analytics off, its loggers (some set their own INFO level at import) at WARNING."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    names = [n for n in logging.root.manager.loggerDict if n.startswith(_NOISY_PREFIXES)]
    for name in {*_NOISY_PREFIXES, *names}:
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


def add_suite(context: Any, source: str, asset: str, suite_name: str, expectations: list[Any]) -> tuple[Any, Any]:
    """A suite of `expectations` and a whole-dataframe batch definition on a new pandas asset of `context`."""
    import great_expectations as gx

    data_asset = context.data_sources.add_pandas(name=source).add_dataframe_asset(name=asset)
    suite = gx.ExpectationSuite(name=suite_name)
    for expectation in expectations:
        suite.add_expectation(expectation)
    return suite, data_asset.add_batch_definition_whole_dataframe("whole")


def _suite_and_batch_definition() -> tuple[Any, Any]:
    """The GX suite and pandas batch definition, created on first use and then reused."""
    if not _gx:
        _quiet()
        import great_expectations as gx
        from great_expectations.data_context.types.base import (
            DataContextConfig,
            InMemoryStoreBackendDefaults,
            ProgressBarsConfig,
        )

        _quiet()
        config = DataContextConfig(  # in-memory stores, no temporary docs site, no progress bars
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
            progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
            analytics_enabled=False,
        )
        context = gx.get_context(mode="ephemeral", project_config=config)
        expect = gx.expectations
        suite, batch_definition = add_suite(context, "shiplift", "decision_dataset", SUITE_NAME, [
            expect.ExpectTableRowCountToBeBetween(min_value=1),
            expect.ExpectColumnValuesToNotBeNull(column="id"),
            expect.ExpectColumnValuesToBeUnique(column="id"),
            expect.ExpectColumnValuesToBeInSet(column="type", value_set=QUESTION_TYPES),
            expect.ExpectColumnValuesToBeBetween(column="n_labels", min_value=MIN_OPTIONS, max_value=MAX_OPTIONS),
            expect.ExpectColumnValuesToBeInSet(column="labels_unique", value_set=[True]),
            expect.ExpectColumnValuesToBeInSet(column="expected_in_labels", value_set=[True]),
            expect.ExpectColumnValueLengthsToBeBetween(column="state_text", min_value=1),
            expect.ExpectColumnValueLengthsToBeBetween(column="question_text", min_value=1),
        ])
        _gx.update(context=context, suite=suite, batch_definition=batch_definition)
    return _gx["suite"], _gx["batch_definition"]


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (dict, list)) and value:
        return json.dumps(value, sort_keys=True)
    return ""


def _row(task: JevTask | Mapping[str, Any]) -> dict[str, Any]:
    record = task.model_dump() if isinstance(task, JevTask) else dict(task)
    question = record.get("question") if isinstance(record.get("question"), Mapping) else {}
    labels = record.get("labels")
    labels = [str(label) for label in labels] if isinstance(labels, (list, tuple)) else []
    expected = record.get("expected")
    expected_label = None if expected is None or isinstance(expected, bool) else str(expected)
    return {
        "id": record.get("id") if isinstance(record.get("id"), str) and record.get("id") else None,
        "type": question.get("type"),
        "family": str(record.get("family")),
        "split": str(record.get("split")),
        "n_labels": len(labels),
        "labels_unique": len(set(labels)) == len(labels),
        "expected_label": expected_label,
        "expected_in_labels": expected_label in labels,
        "state_text": _text(record.get("state")),
        "question_text": _text(question.get("instructions")),
    }


def _balance(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def counts(key: str, subset: list[dict[str, Any]]) -> dict[str, int]:
        return dict(sorted(Counter(str(r[key]) for r in subset).items()))

    by_type_expected = {
        kind: counts("expected_label", [r for r in rows if str(r["type"]) == kind])
        for kind in counts("type", rows)
    }
    return {
        "by_type": counts("type", rows),
        "by_family": counts("family", rows),
        "by_split": counts("split", rows),
        "by_expected": counts("expected_label", rows),
        "by_type_expected": by_type_expected,
        "majority_share_by_type": {
            kind: round(max(per.values()) / sum(per.values()), 4) for kind, per in by_type_expected.items()
        },
    }


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value  # numpy scalars -> JSON-able Python


def _outcome(result: Any) -> ExpectationOutcome:
    config = result.expectation_config
    details = result.result or {}
    unexpected = details.get("unexpected_count")
    if unexpected is None:  # table-level expectations report an observed value instead
        unexpected = 0 if result.success else 1
        sample = [] if result.success else [_plain(details.get("observed_value"))]
    else:
        sample = [_plain(v) for v in list(details.get("partial_unexpected_list") or [])[:SAMPLE_UNEXPECTED]]
    return ExpectationOutcome(
        expectation=config.type, column=config.kwargs.get("column"), success=bool(result.success),
        unexpected_count=int(unexpected), sample_unexpected=sample,
    )


def shared_context() -> Any:
    """The quiet in-memory GX context every suite here runs on (built once per process)."""
    _suite_and_batch_definition()
    return _gx["context"]


def validate_rows(rows: list[dict[str, Any]], columns: list[str], suite_and_batch: Any, *, name: str, what: str,
                  balance: dict[str, Any], fix: str) -> DatasetCheck:
    """Validate rows with a suite; return the check, or raise BadInput naming every failed expectation.

    `suite_and_batch` is called under the lock and returns (suite, batch definition). The raised
    error carries the full DatasetCheck as `error.check` for evidence.
    """
    import pandas as pd

    frame = pd.DataFrame(rows, columns=columns)
    with _lock:
        suite, batch_definition = suite_and_batch()
        batch = batch_definition.get_batch(batch_parameters={"dataframe": frame})
        result = batch.validate(suite, result_format="SUMMARY")
    outcomes = [_outcome(r) for r in result.results]
    check = DatasetCheck(
        name=name, passed=bool(result.success) and all(o.success for o in outcomes),
        row_count=len(rows), expectations=outcomes, balance=balance,
    )
    if not check.passed:
        failed = [
            f"{o.expectation}({o.column or 'table'}): {o.unexpected_count} unexpected, e.g. {o.sample_unexpected}"
            for o in outcomes if not o.success
        ]
        error = BadInput(f"{what} {name!r} failed {len(failed)} expectation(s): " + "; ".join(failed), fix=fix)
        error.check = check  # type: ignore[attr-defined]
        raise error
    return check


def check_decision_dataset(tasks: Sequence[JevTask | Mapping[str, Any]], *, name: str) -> DatasetCheck:
    """Run the decision-dataset suite; return the check, or raise BadInput naming failed expectations.

    `tasks` are JevTasks or raw JevBench records. The raised error carries the full
    DatasetCheck as `error.check` for evidence.
    """
    rows = [_row(task) for task in tasks]
    return validate_rows(
        rows, list(_row({}).keys()), _suite_and_batch_definition, name=name, what="decision dataset",
        balance=_balance(rows),
        fix="fix the listed rows (unique ids, expected label among 2-16 unique labels, "
        "non-empty state and question, type noul|choice|score)",
    )
