"""NLI loader (ours, SNLI, MNLI field names; JSONL and TSV), the project's NLI set, and its GX suite."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from shiplift.tasks.errors import BadInput, NotFound
from shiplift.tasks.hashing import sha256_file
from shiplift.validation.nli.builtin_set import DEFAULT_OUT, build_records, render
from shiplift.validation.nli.expectations import check_nli_pairs
from shiplift.validation.nli.pairs import LABELS, NliPair, load_nli

DATA = Path(__file__).resolve().parents[2] / "validation" / "data" / "nli.jsonl"


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_our_jsonl_fields(tmp_path):
    path = write_jsonl(tmp_path / "ours.jsonl", [
        {"id": "a", "premise": "P1", "hypothesis": "H1", "label": "entailment", "split": "test", "domain": "x"},
        {"id": "b", "premise": "P2", "hypothesis": "H2", "label": "contradiction"},
    ])
    loaded = load_nli(path)
    assert loaded.pairs == [
        NliPair(id="a", premise="P1", hypothesis="H1", label="entailment", split="test"),
        NliPair(id="b", premise="P2", hypothesis="H2", label="contradiction", split=None),
    ]
    assert loaded.dropped_unlabelled == 0
    assert loaded.path == str(path) and loaded.sha256 == sha256_file(path)


def test_snli_jsonl_drops_and_counts_unlabelled(tmp_path):
    path = write_jsonl(tmp_path / "snli_dev.jsonl", [
        {"annotator_labels": ["neutral"], "captionID": "c1", "gold_label": "neutral", "pairID": "p1",
         "sentence1": "A man plays.", "sentence2": "A man plays guitar.", "sentence1_parse": "(ROOT)"},
        {"gold_label": "-", "pairID": "p2", "sentence1": "A dog runs.", "sentence2": "An animal moves."},
        {"gold_label": "entailment", "pairID": "p3", "sentence1": "A dog runs.", "sentence2": "A dog moves."},
        {"gold_label": "-", "pairID": "p4", "sentence1": "X.", "sentence2": "Y."},
    ])
    loaded = load_nli(path)
    assert [(p.id, p.label) for p in loaded.pairs] == [("p1", "neutral"), ("p3", "entailment")]
    assert loaded.pairs[0].premise == "A man plays." and loaded.pairs[0].hypothesis == "A man plays guitar."
    assert loaded.dropped_unlabelled == 2


def test_mnli_tsv_with_extra_columns_and_prompt_ids(tmp_path):
    header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label"
    rows = [
        ("0\t31193\t31193n\tgovernment\tConceptually cream skimming has two dimensions.\t"
         "Product and geography are what make cream skimming work.\tneutral\tneutral"),
        "1\t101457\t101457e\ttelephone\tyou know during the season\tYou lose the things.\tentailment\t-",
        ("2\t134793\t134793e\tfiction\tOne of our number will carry out your instructions.\t"
         "A member of my team will execute your orders.\tentailment\tentailment"),
    ]
    path = tmp_path / "dev_matched.tsv"
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    loaded = load_nli(path)
    assert [(p.id, p.label) for p in loaded.pairs] == [("31193n", "neutral"), ("134793e", "entailment")]
    assert loaded.dropped_unlabelled == 1


def test_prompt_id_used_when_no_pair_id_and_ids_generated_from_stem_and_line(tmp_path):
    path = write_jsonl(tmp_path / "mixed.jsonl", [
        {"promptID": 7, "sentence1": "A.", "sentence2": "B.", "gold_label": "neutral"},
        {"premise": "C.", "hypothesis": "D.", "label": "entailment"},
    ])
    text = path.read_text()
    path.write_text(text.replace("\n", "\n\n", 1))  # a blank line: ids follow real line numbers
    assert [p.id for p in load_nli(path).pairs] == ["7", "mixed-3"]


def test_tsv_generated_ids_use_line_numbers(tmp_path):
    path = tmp_path / "plain.tsv"
    path.write_text("premise\thypothesis\tlabel\nA.\tB.\tneutral\nC.\tD.\tcontradiction\n", encoding="utf-8")
    assert [p.id for p in load_nli(path).pairs] == ["plain-2", "plain-3"]


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ({"premise": "A.", "hypothesis": "B.", "label": "maybe"}, "label 'maybe' is not one of"),
        ({"premise": "A.", "hypothesis": "B.", "label": 1}, "label 1 is not one of"),
        ({"premise": "  ", "hypothesis": "B.", "label": "neutral"}, "premise / sentence1 is empty"),
        ({"premise": "A.", "hypothesis": "", "label": "neutral"}, "hypothesis / sentence2 is empty"),
        ({"premise": "A.", "label": "neutral"}, "missing field hypothesis / sentence2"),
        ({"premise": "A.", "hypothesis": "B."}, "missing field label / gold_label"),
        ({"premise": "A.", "hypothesis": ["B."], "label": "neutral"}, "expected text"),
        ({"premise": "A.", "hypothesis": "B.", "label": "neutral", "gold_label": "entailment"}, "disagree"),
        ({"id": "", "premise": "A.", "hypothesis": "B.", "label": "neutral"}, "id ''"),
        ({"premise": "A.", "hypothesis": "B.", "label": "neutral", "split": ""}, "split ''"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, record, needle):
    good = {"premise": "Fine.", "hypothesis": "Fine too.", "label": "entailment"}
    path = write_jsonl(tmp_path / "bad.jsonl", [good, record])
    with pytest.raises(BadInput) as info:
        load_nli(path)
    assert f"{path}:2" in str(info.value) and needle in str(info.value)


def test_file_level_errors(tmp_path):
    with pytest.raises(NotFound):
        load_nli(tmp_path / "missing.jsonl")
    odd = tmp_path / "pairs.csv"
    odd.write_text("premise,hypothesis,label\n")
    with pytest.raises(BadInput, match="suffix '.csv'"):
        load_nli(odd)
    only_unlabelled = write_jsonl(tmp_path / "u.jsonl", [{"sentence1": "A", "sentence2": "B", "gold_label": "-"}])
    with pytest.raises(BadInput, match="no labelled pairs .1 unlabelled"):
        load_nli(only_unlabelled)
    not_json = tmp_path / "broken.jsonl"
    not_json.write_text('{"premise": "A"\n')
    with pytest.raises(BadInput, match="broken.jsonl:1: invalid JSON"):
        load_nli(not_json)
    ragged = tmp_path / "ragged.tsv"
    ragged.write_text("premise\thypothesis\tlabel\nA\tB\tneutral\textra\n")
    with pytest.raises(BadInput, match="ragged.tsv:2: 4 columns but the header has 3"):
        load_nli(ragged)


# ------------------------------------------------------------------ the project's set


@pytest.fixture(scope="module")
def project_set():
    return load_nli(DATA)


def test_regenerating_gives_identical_bytes():
    assert DEFAULT_OUT == DATA
    assert render(build_records()) == DATA.read_bytes()


def test_size_balance_ids_and_stratified_splits(project_set):
    pairs = project_set.pairs
    assert len(pairs) >= 360 and project_set.dropped_unlabelled == 0
    assert len({p.id for p in pairs}) == len(pairs)
    assert len({(p.premise, p.hypothesis) for p in pairs}) == len(pairs)
    by_label = Counter(p.label for p in pairs)
    assert set(by_label) == set(LABELS) and len(set(by_label.values())) == 1
    for label in LABELS:
        splits = Counter(p.split for p in pairs if p.label == label)
        assert splits == {"train": 75, "reserve": 25, "calibration": 20, "test": 30}  # 15 / 5 / 4 / 6 a domain


def test_no_passage_appears_in_two_splits(project_set):
    splits_of: dict[str, set] = {}
    for pair in project_set.pairs:
        splits_of.setdefault(pair.premise, set()).add(pair.split)
    assert all(len(s) == 1 for s in splits_of.values())


def test_contradictions_and_neutrals_are_varied_across_domains():
    records = build_records()
    assert len({r["domain"] for r in records}) >= 5
    phenomena = Counter(r["phenomenon"] for r in records if r["label"] == "contradiction")
    assert {"number", "negation", "swapped entity"} <= set(phenomena) and len(phenomena) >= 5
    assert max(phenomena.values()) / sum(phenomena.values()) < 0.5
    neutral_hypotheses = {r["hypothesis"] for r in records if r["label"] == "neutral"}
    assert len(neutral_hypotheses) >= 100  # extra details differ, not one template repeated


def test_project_set_passes_expectations_with_balance(project_set):
    check = check_nli_pairs(project_set.pairs, name="project-nli")
    assert check.passed and check.row_count == len(project_set.pairs)
    balance = check.balance
    assert balance["majority_share"] == pytest.approx(1 / 3, abs=1e-3)
    assert set(balance["by_split_label"]) == {"train", "reserve", "calibration", "test"}
    assert balance["by_split_label"]["test"] == {label: 30 for label in LABELS}


def test_expectations_list_every_failure():
    rows = [
        {"id": "a", "premise": "P", "hypothesis": "H", "label": "entailment", "split": None},
        {"id": "a", "premise": "P", "hypothesis": "  ", "label": "maybe", "split": None},
        {"id": None, "premise": "", "hypothesis": "H", "label": "neutral", "split": None},
    ]
    with pytest.raises(BadInput) as info:
        check_nli_pairs(rows, name="broken")
    message = str(info.value)
    for part in ("expect_column_values_to_be_unique(id)", "expect_column_values_to_not_be_null(id)",
                 "expect_column_values_to_be_in_set(label): 1 unexpected, e.g. ['maybe']",
                 "expect_column_value_lengths_to_be_between(premise)",
                 "expect_column_value_lengths_to_be_between(hypothesis)"):
        assert part in message
    check = info.value.check
    assert not check.passed and check.balance["by_label"] == {"entailment": 1, "maybe": 1, "neutral": 1}
    with pytest.raises(BadInput, match="expect_table_row_count_to_be_between"):
        check_nli_pairs([], name="empty")
