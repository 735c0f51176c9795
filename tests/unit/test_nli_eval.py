"""evaluate_nli against fake encoder servers: gate, NLI metrics vs sklearn, reports, truncation, champion."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from sklearn.metrics import f1_score, recall_score

from shiplift.tasks.errors import BadInput
from shiplift.validation.evaluate import RunSettings, Target
from shiplift.validation.gates import ChampionRule
from shiplift.validation.nli.builtin_set import DEFAULT_OUT
from shiplift.validation.nli.evaluate import (
    NliThresholds,
    evaluate_nli,
    load_nli_dataset,
    nli_metrics,
)
from shiplift.validation.nli.pairs import LABELS
from shiplift.validation.runner import read_predictions
from tests.unit.test_nli_runner import FakeEncoder, key

SETTINGS = RunSettings(concurrency=2, timeout_s=10, deadline_s=60, n_bootstrap=200, seed=3)
LOOSE = NliThresholds(min_accuracy=0.5, min_macro_f1=0.5, min_class_recall=0.4, max_ece=0.5)


@pytest.fixture(scope="module")
def test_split():
    return load_nli_dataset(DEFAULT_OUT, name="nli-test", splits=["test"])


@pytest.fixture
def fakes():
    servers = [FakeEncoder(), FakeEncoder()]
    yield servers
    for server in servers:
        server.close()


def answer_with_confusion(fake: FakeEncoder, pairs, wrong_every: int) -> None:
    """Right on most pairs; every `wrong_every`-th pair answers the next label (a real confusion pattern)."""
    for i, pair in enumerate(pairs):
        label = pair.label if i % wrong_every else LABELS[(LABELS.index(pair.label) + 1) % 3]
        fake.answers[key(pair)] = label


def sklearn_reference(rows):
    truth = [r["expected"] for r in rows]
    guess = [r["option_ids"][r["probabilities"].index(max(r["probabilities"]))] if r["error"] is None else "invalid"
             for r in rows]
    return (
        f1_score(truth, guess, labels=list(LABELS), average="macro", zero_division=0),
        recall_score(truth, guess, labels=list(LABELS), average=None, zero_division=0),
    )


def test_pass_with_metrics_matching_sklearn_and_reports_written(fakes, test_split, tmp_path):
    fake = fakes[0]
    answer_with_confusion(fake, test_split.pairs, wrong_every=4)
    fake.truncate = {key(test_split.pairs[5])}
    fake.fail_503 = {key(test_split.pairs[16]): 1}
    messages = []
    result = evaluate_nli(Target.http(fake.url, label="minilm"), [test_split], tmp_path, thresholds=LOOSE,
                          champion_rule=None, settings=SETTINGS, progress=messages.append, title="NLI test")
    assert result["decision"] == "pass"
    rows = [p.to_dict() for p in read_predictions(tmp_path / "predictions.jsonl")]
    assert len(rows) == 90 and [r["id"] for r in rows] == [p.id for p in test_split.pairs]
    f1, recalls = sklearn_reference(rows)
    nli = result["metrics"]["nli"]
    assert nli["macro_f1"]["value"] == pytest.approx(f1) and nli["macro_f1"]["n"] == 90
    for label, recall in zip(LABELS, recalls, strict=True):
        estimate = nli["per_class_recall"][label]
        assert estimate["value"] == pytest.approx(recall) and estimate["n"] == 30
        assert estimate["ci"][0] <= estimate["value"] <= estimate["ci"][1]
    assert nli["macro_f1"]["ci"][0] <= f1 <= nli["macro_f1"]["ci"][1]
    assert result["metrics"]["accuracy"]["value"] == pytest.approx(1 - 23 / 90)  # i % 4 == 0 for 23 of 90
    checks = {c["name"]: c for c in result["checks"]}
    assert {"accuracy", "ece", "validity", "macro_f1", "recall_entailment", "recall_neutral",
            "recall_contradiction", "champion_accuracy"} <= set(checks)
    assert checks["macro_f1"]["observed"] == pytest.approx(f1) and checks["macro_f1"]["threshold"] == 0.5
    assert checks["champion_accuracy"]["status"] == "skipped"
    assert result["metrics"]["retries_503"] == 8  # one retried batch of eight pairs, each counts it
    assert result["n_truncated"] == 1
    assert result["truncation"]["candidate"]["nli-test"]["truncated"][0]["id"] == test_split.pairs[5].id
    assert any("1 of 90 pairs truncated" in m for m in messages)
    assert "nli-test: 90 pairs, 0 unlabelled row(s) dropped" in messages
    report = json.loads((tmp_path / "gate-report.json").read_text())
    assert report["thresholds"] == LOOSE.model_dump(mode="json")
    assert report["metrics"]["nli"]["macro_f1"]["value"] == pytest.approx(f1)
    assert report["extra"]["truncation"]["candidate"]["nli-test"]["n_truncated"] == 1
    assert "divided by its number of pairs" in report["extra"]["latency_note"]
    assert report["extra"]["datasets"][0]["sha256"] == test_split.sha256
    html = (tmp_path / "report.html").read_text()
    assert "recall_neutral" in html and "macro_f1" in html and 'id="decision">pass<' in html


def test_class_recall_threshold_fails_a_model_that_never_says_neutral(fakes, test_split, tmp_path):
    fake = fakes[0]
    for pair in test_split.pairs:  # neutral pairs are answered entailment: accuracy 2/3 still clears 0.5
        fake.answers[key(pair)] = "entailment" if pair.label == "neutral" else pair.label
    result = evaluate_nli(Target.http(fake.url), [test_split], tmp_path, thresholds=LOOSE, champion_rule=None,
                          settings=SETTINGS)
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["accuracy"]["status"] == "pass"
    assert checks["recall_neutral"]["status"] == "fail" and checks["recall_neutral"]["observed"] == 0.0
    assert checks["recall_entailment"]["status"] == "pass"
    assert result["decision"] == "fail"


def test_a_check_the_build_judged_is_decided_with_the_gate(fakes, test_split, tmp_path):
    """The int8 budget the build judged (tasks.artifacts.onnx_export.int8_budget_check) decides with the gate's own
    checks: no check of the gate fails here, so its failure alone fails the gate and is named; without thresholds it is
    left out."""
    from shiplift.tasks.artifacts.onnx_export import int8_budget_check

    fake = fakes[0]
    answer_with_confusion(fake, test_split.pairs, wrong_every=10)
    over = int8_budget_check(0.70, 0.65, 60, 0.01)
    result = evaluate_nli(Target.http(fake.url), [test_split], tmp_path, thresholds=LOOSE, champion_rule=None,
                          settings=SETTINGS, build_checks=[over])
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["int8_accuracy_drop_vs_fp32"]["status"] == "fail" and result["decision"] == "fail"
    assert [name for name, c in checks.items() if c["status"] == "fail"] == ["int8_accuracy_drop_vs_fp32"]
    ungated = evaluate_nli(Target.http(fake.url), [test_split], tmp_path / "adhoc", thresholds=None, champion_rule=None,
                           settings=SETTINGS, build_checks=[over])
    assert "int8_accuracy_drop_vs_fp32" not in {c["name"] for c in ungated["checks"]}


def test_a_400_batch_makes_rows_invalid_and_fails_validity(fakes, test_split, tmp_path):
    fake = fakes[0]
    answer_with_confusion(fake, test_split.pairs, wrong_every=10)
    fake.reject = {key(test_split.pairs[0])}
    result = evaluate_nli(Target.http(fake.url), [test_split], tmp_path, thresholds=LOOSE, champion_rule=None,
                          settings=SETTINGS)
    rows = [p.to_dict() for p in read_predictions(tmp_path / "predictions.jsonl")]
    assert [r["error"] is not None for r in rows[:10]] == [True] * 8 + [False] * 2  # batch_size 8
    f1, _ = sklearn_reference(rows)  # invalid rows are misses for their true class
    assert result["metrics"]["nli"]["macro_f1"]["value"] == pytest.approx(f1)
    assert result["metrics"]["nli"]["invalid_predictions"] == 8
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["validity"]["status"] == "fail" and checks["validity"]["observed"] == pytest.approx(82 / 90)
    assert result["decision"] == "fail"


def test_champion_is_scored_on_the_same_pairs(fakes, test_split, tmp_path):
    candidate, champion = fakes
    answer_with_confusion(candidate, test_split.pairs, wrong_every=5)
    answer_with_confusion(champion, test_split.pairs, wrong_every=3)
    rule = ChampionRule(margin=0.05, min_samples=30, n_bootstrap=200)
    result = evaluate_nli(Target.http(candidate.url, label="new"), [test_split], tmp_path, thresholds=LOOSE,
                          champion_rule=rule, champion=Target.http(champion.url, label="old"), settings=SETTINGS)
    assert (tmp_path / "champion-predictions.jsonl").is_file()
    check = {c["name"]: c for c in result["checks"]}["champion_accuracy"]
    assert check["n"] == 90 and check["observed"] == pytest.approx((1 - 18 / 90) - (1 - 30 / 90))
    assert check["status"] == "pass"
    champion_rows = [p.to_dict() for p in read_predictions(tmp_path / "champion-predictions.jsonl")]
    assert result["champion"]["nli"]["macro_f1"]["value"] == pytest.approx(sklearn_reference(champion_rows)[0])
    assert result["truncation"]["champion"]["nli-test"]["n_truncated"] == 0


def test_nli_metrics_by_hand():
    rows = [
        {"id": "a", "expected": "entailment", "option_ids": list(LABELS), "probabilities": [0.8, 0.1, 0.1]},
        {"id": "b", "expected": "entailment", "option_ids": list(LABELS), "probabilities": [0.1, 0.8, 0.1]},
        {"id": "c", "expected": "neutral", "option_ids": list(LABELS), "probabilities": [0.1, 0.8, 0.1]},
        {"id": "d", "expected": "contradiction", "option_ids": list(LABELS), "probabilities": None},
    ]
    rows = [{**r, "allowed_token_mass": None, "latency_ms": 1.0, "retries_503": 0, "started_at": 0.0,
             "error": None if r["probabilities"] else "HTTP 400: no"} for r in rows]
    metrics = nli_metrics(rows, n_bootstrap=100)
    # F1: entailment 2/(2+0+1)=2/3, neutral 2/(2+1+0)=2/3, contradiction 0 -> macro 4/9
    assert metrics["macro_f1"]["value"] == pytest.approx(4 / 9)
    recall = {label: metrics["per_class_recall"][label]["value"] for label in LABELS}
    assert recall == {"entailment": 0.5, "neutral": 1.0, "contradiction": 0.0}
    assert metrics["predicted_counts"] == {"entailment": 1, "neutral": 2, "contradiction": 0}
    assert metrics["invalid_predictions"] == 1


def test_thresholds_are_strict():
    with pytest.raises(ValidationError):
        NliThresholds(min_accuracy=0.5, min_macro_f1=0.5, min_class_recall=0.4, max_ece=0.5, min_f1=0.1)
    with pytest.raises(ValidationError):
        NliThresholds(min_accuracy=1.5, min_macro_f1=0.5, min_class_recall=0.4, max_ece=0.5)
    with pytest.raises(ValidationError):
        NliThresholds(min_accuracy=0.5, min_macro_f1=0.5, max_ece=0.5)
    with pytest.raises(ValidationError):
        LOOSE.min_accuracy = 0.1


def test_dataset_loading_filters_splits_and_refuses_missing_ones(tmp_path):
    both = load_nli_dataset(DEFAULT_OUT, name="cal+test", splits=["calibration", "test"])
    assert len(both.pairs) == 150 and both.evidence()["splits"] == ("calibration", "test")
    assert both.evidence()["dropped_unlabelled"] == 0 and both.check["passed"]
    with pytest.raises(BadInput, match=r"no pairs in split\(s\) \['dev'\]"):
        load_nli_dataset(DEFAULT_OUT, name="x", splits=["dev"])
    with pytest.raises(BadInput, match="no NLI datasets"):
        evaluate_nli(Target.http("http://127.0.0.1:9"), [], tmp_path, thresholds=LOOSE, champion_rule=None)
