"""JevBench loader, SemIf decision conversion, and the project's own decision set."""

from __future__ import annotations

import collections
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from shiplift.tasks.errors import BadInput, NotFound
from shiplift.tasks.hashing import sha256_bytes
from shiplift.validation.decisions import decision_set
from shiplift.validation.decisions.jevbench import dataset_sha256, load_jevbench

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "jevbench"
DECISIONS = decision_set.DEFAULT_OUT
needs_shared = pytest.mark.skipif(
    not (SHARED / "easy.jsonl").is_file(), reason=f"public JevBench copies not present at {SHARED}"
)

CHOICE = {
    "id": "c1", "family": "intent", "group": None, "split": "test", "state": "Where is my parcel?",
    "question": {"type": "choice", "instructions": "Which intent?",
                 "criteria": {"alpha": "First thing", "beta": None, "gamma": "Third thing"}},
    "labels": ["gamma", "alpha", "beta"], "expected": "alpha",
}
NOUL = {
    "id": "n1", "family": "fact", "group": "g", "split": "test", "state": "The sky is green.",
    "question": {"type": "noul", "instructions": "Is the sky green?",
                 "criteria": {"true": "It is the case", "false": "It is not the case"}},
    "labels": ["no", "yes"], "expected": "yes",
}
SCORE = {
    "id": "s1", "family": "urgency", "group": None, "split": "calibration", "state": "Server on fire",
    "question": {"type": "score", "instructions": "How urgent?", "criteria": ["none", "low", "high"]},
    "labels": ["0", "1", "2"], "expected": 2,
}


def write(tmp_path: Path, *records: object, raw: str | None = None) -> Path:
    path = tmp_path / "tasks.jsonl"
    text = raw if raw is not None else "".join(json.dumps(r) + "\n" for r in records)
    path.write_text(text, encoding="utf-8")
    return path


def test_decision_options_follow_labels_not_criteria_order(tmp_path):
    (task,) = load_jevbench(write(tmp_path, CHOICE))
    decision = task.to_decision()
    assert decision == {
        "id": "c1", "state": "Where is my parcel?", "question": "Which intent?",
        "options": [{"id": "gamma", "description": "Third thing"}, {"id": "alpha", "description": "First thing"},
                    {"id": "beta", "description": "beta"}],
    }
    assert task.expected_label == "alpha"


def test_noul_maps_true_false_criteria_to_yes_no_options(tmp_path):
    swapped = {**NOUL, "labels": ["yes", "no"]}
    tasks = load_jevbench(write(tmp_path, NOUL, {**swapped, "id": "n2"}))
    assert tasks[0].to_decision()["options"] == [
        {"id": "no", "description": "It is not the case"}, {"id": "yes", "description": "It is the case"}]
    assert [o["id"] for o in tasks[1].to_decision()["options"]] == ["yes", "no"]


def test_score_expected_int_becomes_label_string(tmp_path):
    (task,) = load_jevbench(write(tmp_path, SCORE))
    assert task.expected_label == "2"
    assert [o["description"] for o in task.to_decision()["options"]] == ["none", "low", "high"]


def test_tasks_are_frozen(tmp_path):
    (task,) = load_jevbench(write(tmp_path, CHOICE))
    with pytest.raises(ValidationError, match="frozen"):
        task.id = "other"


def _mutate(record: dict, dotted: str, value: object) -> dict:
    out = copy.deepcopy(record)
    *parents, leaf = dotted.split(".")
    target = out
    for key in parents:
        target = target[key]
    target[leaf] = value
    return out


@pytest.mark.parametrize(
    ("record", "field", "value", "needle"),
    [
        (CHOICE, "expected", "delta", "field 'expected'"),
        (CHOICE, "question.type", "multi", "field 'question.type'"),
        (CHOICE, "question.criteria", {"alpha": "a", "beta": "b"}, "missing ['gamma']"),
        (CHOICE, "labels", ["alpha"], "field 'labels'"),
        (CHOICE, "labels", ["alpha", "alpha", "beta"], "unique"),
        (CHOICE, "labels", [f"l{i}" for i in range(17)], "need 2..16"),
        (CHOICE, "state", "   ", "field 'state'"),
        (CHOICE, "question.instructions", "", "field 'question.instructions'"),
        (CHOICE, "surprise", 1, "field 'surprise'"),
        (NOUL, "expected", "maybe", "field 'expected'"),
        (NOUL, "labels", ["false", "true"], "field 'labels'"),
        (SCORE, "expected", 3, "outside 0..2"),
        (SCORE, "labels", ["1", "2", "3"], "field 'labels'"),
        (SCORE, "question.criteria", ["a", "b"], "list of 3"),
    ],
)
def test_bad_tasks_name_file_line_and_field(tmp_path, record, field, value, needle):
    path = write(tmp_path, NOUL, _mutate(record, field, value))
    with pytest.raises(BadInput) as info:
        load_jevbench(path)
    assert f"{path}:2:" in str(info.value)
    assert needle in str(info.value)


def test_invalid_json_missing_file_and_empty_file(tmp_path):
    with pytest.raises(BadInput, match=r"tasks.jsonl:2: invalid JSON"):
        load_jevbench(write(tmp_path, raw=json.dumps(CHOICE) + "\n{not json\n"))
    with pytest.raises(BadInput, match="holds no tasks"):
        load_jevbench(write(tmp_path, raw="\n"))
    with pytest.raises(NotFound):
        load_jevbench(tmp_path / "absent.jsonl")


def test_dataset_sha256_is_sha_of_bytes(tmp_path):
    path = write(tmp_path, CHOICE)
    assert dataset_sha256(path) == sha256_bytes(path.read_bytes())


@needs_shared
@pytest.mark.parametrize(("name", "count"), [("easy", 48), ("original", 72)])
def test_public_jevbench_loads(name, count):
    tasks = load_jevbench(SHARED / f"{name}.jsonl")
    assert len(tasks) == count
    for task, line in zip(tasks, (SHARED / f"{name}.jsonl").read_text().splitlines(), strict=True):
        raw = json.loads(line)
        assert [o["id"] for o in task.to_decision()["options"]] == raw["labels"]
        assert task.expected_label == str(raw["expected"])


# --- the project's own decision set -------------------------------------------------------

def test_committed_decision_set_matches_regeneration():
    assert DECISIONS.read_bytes() == decision_set.render_jsonl(decision_set.build_decision_set())


def test_cli_writes_identical_bytes(tmp_path):
    out = tmp_path / "d.jsonl"
    subprocess.run([sys.executable, "-m", "shiplift.validation.decisions.decision_set", "--out", str(out)], check=True,
                   cwd=Path(decision_set.__file__).parents[2], capture_output=True)
    assert out.read_bytes() == DECISIONS.read_bytes()


def test_decision_set_shape_and_balance():
    tasks = load_jevbench(DECISIONS)
    assert len(tasks) >= 150
    assert len({t.id for t in tasks}) == len(tasks)
    types = collections.Counter(t.question.type for t in tasks)
    assert set(types) == {"choice", "noul", "score"}
    assert len({t.family for t in tasks}) >= 5
    calibration = sum(t.split == "calibration" for t in tasks) / len(tasks)
    assert {t.split for t in tasks} == {"calibration", "test"}
    assert 0.35 <= calibration <= 0.45
    for family in {t.family for t in tasks}:
        counts = collections.Counter(t.expected_label for t in tasks if t.family == family)
        assert max(counts.values()) - min(counts.values()) <= 1, (family, counts)
    positions = collections.Counter(t.labels.index(t.expected_label) for t in tasks if t.question.type == "choice")
    assert max(positions.values()) / sum(positions.values()) < 0.35  # answer not stuck in one slot
    assert len({t.labels for t in tasks if t.family == "intent"}) > 5  # label order varies
