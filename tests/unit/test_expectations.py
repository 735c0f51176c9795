"""Great Expectations suite for decision datasets."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shiplift.tasks.errors import BadInput
from shiplift.validation.decisions import decision_set
from shiplift.validation.decisions.jevbench import load_jevbench
from shiplift.validation.expectations import check_decision_dataset

REPO = Path(decision_set.__file__).resolve().parents[2]
DECISIONS = decision_set.DEFAULT_OUT
SHARED = REPO.parent / "shared" / "data" / "jevbench"

RECORD = {
    "id": "r0", "family": "f", "group": None, "split": "test", "state": "some state",
    "question": {"type": "choice", "instructions": "Pick", "criteria": None},
    "labels": ["a", "b", "c"], "expected": "b",
}


def records(count: int = 4) -> list[dict]:
    out = []
    for i in range(count):
        record = copy.deepcopy(RECORD)
        record["id"] = f"r{i}"
        out.append(record)
    return out


def test_own_decision_set_passes_with_balance_report():
    tasks = load_jevbench(DECISIONS)
    check = check_decision_dataset(tasks, name="shiplift-decisions")
    assert check.passed and check.row_count == len(tasks)
    assert len(check.expectations) == 9 and all(o.success for o in check.expectations)
    balance = check.balance
    assert sum(balance["by_type"].values()) == len(tasks)
    assert balance["by_type_expected"]["noul"] == {"no": 20, "yes": 20}
    assert balance["by_type_expected"]["score"] == {"0": 10, "1": 10, "2": 10, "3": 10}
    assert balance["majority_share_by_type"]["noul"] == 0.5
    assert set(balance["by_split"]) == {"calibration", "test"}
    assert json.loads(json.dumps(check.to_dict()))["name"] == "shiplift-decisions"


@pytest.mark.skipif(not (SHARED / "original.jsonl").is_file(), reason=f"public JevBench not present at {SHARED}")
def test_public_jevbench_passes():
    check = check_decision_dataset(load_jevbench(SHARED / "original.jsonl"), name="original")
    assert check.passed and check.row_count == 72


def _break(rows: list[dict], how: str) -> None:
    if how == "duplicate_id":
        rows[1]["id"] = rows[0]["id"]
    elif how == "missing_id":
        rows[2]["id"] = ""
    elif how == "expected_outside":
        rows[0]["expected"] = "z"
    elif how == "one_label":
        rows[0]["labels"], rows[0]["expected"] = ["b"], "b"
    elif how == "seventeen_labels":
        rows[0]["labels"] = ["b"] + [f"x{i}" for i in range(16)]
    elif how == "repeated_label":
        rows[0]["labels"] = ["a", "b", "b"]
    elif how == "blank_state":
        rows[3]["state"] = "  "
    elif how == "blank_question":
        rows[3]["question"]["instructions"] = ""
    elif how == "bad_type":
        rows[1]["question"]["type"] = "multiple"


@pytest.mark.parametrize(
    ("how", "failed"),
    [
        ("duplicate_id", {("expect_column_values_to_be_unique", "id")}),
        ("missing_id", {("expect_column_values_to_not_be_null", "id")}),
        ("expected_outside", {("expect_column_values_to_be_in_set", "expected_in_labels")}),
        ("one_label", {("expect_column_values_to_be_between", "n_labels")}),
        ("seventeen_labels", {("expect_column_values_to_be_between", "n_labels")}),
        ("repeated_label", {("expect_column_values_to_be_in_set", "labels_unique")}),
        ("blank_state", {("expect_column_value_lengths_to_be_between", "state_text")}),
        ("blank_question", {("expect_column_value_lengths_to_be_between", "question_text")}),
        ("bad_type", {("expect_column_values_to_be_in_set", "type")}),
    ],
)
def test_each_broken_rule_fails_exactly_its_expectation(how, failed):
    rows = records()
    _break(rows, how)
    with pytest.raises(BadInput) as info:
        check_decision_dataset(rows, name="broken")
    check = info.value.check
    assert not check.passed
    assert {(o.expectation, o.column) for o in check.expectations if not o.success} == failed
    (expectation, column) = next(iter(failed))
    assert f"'broken' failed 1 expectation(s): {expectation}({column}): " in str(info.value)


def test_empty_dataset_fails_row_count():
    with pytest.raises(BadInput, match=r"expect_table_row_count_to_be_between\(table\)"):
        check_decision_dataset([], name="empty")


def test_suite_is_quiet_and_writes_no_files(tmp_path):
    """In a fresh process: no GX log lines or progress bars at DEBUG, and nothing written to cwd or TMPDIR."""
    work, tmp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    tmp.mkdir()
    script = (
        "import logging; logging.basicConfig(level=logging.DEBUG)\n"
        "from shiplift.validation.expectations import check_decision_dataset\n"
        f"print(check_decision_dataset({records()!r}, name='x').passed)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp)}
    done = subprocess.run([sys.executable, "-c", script], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    noisy = [line for line in done.stderr.splitlines() if "great_expectations" in line or "Calculating Metrics" in line]
    assert noisy == []
    assert list(work.iterdir()) == [] and list(tmp.iterdir()) == []
