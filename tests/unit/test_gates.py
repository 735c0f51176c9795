"""Gates: absolute thresholds, paired champion comparison, decision rules, typed thresholds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from shiplift.tasks.errors import BadInput, GateFailed
from shiplift.validation.gates import ChampionRule, DecisionThresholds, evaluate_gates
from shiplift.validation.metrics import decision_metrics

OPTIONS = ["a", "b", "c"]


def row(ident, probs, expected="a", *, error=None, latency=100.0, started=0.0, retries=0, mass=0.9):
    return {
        "id": ident, "dataset": "unit", "expected": expected, "option_ids": OPTIONS, "probabilities": probs,
        "option_logits": None, "allowed_token_mass": mass, "temperature": 1.0, "latency_ms": latency,
        "server_forward_ms": None, "server_total_ms": None, "attempts": 1 + retries, "retries_503": retries,
        "error": error, "started_at": started,
    }


def model_rows(n, accuracy, seed, *, confidence=None, ids_from=0, latency=100.0):
    """n rows; exactly round(n*accuracy) correct; confidence = the accuracy (calibrated) unless given."""
    rng = np.random.default_rng(seed)
    right = set(rng.choice(n, size=round(n * accuracy), replace=False).tolist())
    top = accuracy if confidence is None else confidence
    top = min(max(top, 0.34), 0.98)
    rows = []
    for i in range(n):
        guess = "a" if i in right else "b"
        probs = [top if o == guess else (1 - top) / 2 for o in OPTIONS]
        rows.append(row(f"t{ids_from + i:04d}", probs, "a", latency=latency + i % 7, started=float(i)))
    return rows


LOOSE = DecisionThresholds(min_accuracy=0.5, max_ece=0.2)
RULE = ChampionRule(n_bootstrap=300)


def status(report, name):
    return next(c for c in report.checks if c.name == name).status


def test_thresholds_are_typed_strict_and_frozen():
    t = DecisionThresholds(min_accuracy=0.7, max_ece=0.1)
    assert t.min_validity == 1.0 and t.max_p95_latency_ms is None and t.min_allowed_token_mass is None
    with pytest.raises(ValidationError):
        DecisionThresholds(min_accuracy=0.7, max_ece=0.1, max_eec=0.1)  # typo: extra keys are refused
    with pytest.raises(ValidationError):
        DecisionThresholds(min_accuracy=1.5, max_ece=0.1)
    with pytest.raises(ValidationError):
        DecisionThresholds(min_accuracy=float("nan"), max_ece=0.1)
    with pytest.raises(ValidationError):
        DecisionThresholds(max_ece=0.1)  # min_accuracy is required
    with pytest.raises(ValidationError):
        t.min_accuracy = 0.1
    rule = ChampionRule()
    assert (rule.metric, rule.margin, rule.min_samples, rule.n_bootstrap, rule.seed) == ("accuracy", 0.02, 30, 1000, 0)
    with pytest.raises(ValidationError):
        ChampionRule(metric="f1")
    with pytest.raises(ValidationError):
        ChampionRule(margin=-0.1)


def test_all_absolute_checks_pass_without_champion():
    preds = model_rows(100, 0.8, seed=1)
    thresholds = DecisionThresholds(
        min_accuracy=0.7, max_ece=0.05, max_p95_latency_ms=500.0, min_allowed_token_mass=0.5
    )
    report = evaluate_gates(preds, thresholds=thresholds, champion_rule=RULE, decision_rule="point")
    assert report.decision == "pass" and report.decision_rule == "point"
    assert {c.rule for c in report.checks if c.status != "skipped"} == {"point"}
    names = [c.name for c in report.checks]
    assert names == ["accuracy", "ece", "validity", "p95_latency_ms", "allowed_token_mass", "champion_accuracy"]
    acc = report.checks[0]
    assert acc.observed == pytest.approx(0.8) and acc.threshold == 0.7 and acc.comparator == ">="
    assert acc.ci[0] <= 0.8 <= acc.ci[1] and acc.n == 100 and acc.passed
    champion = report.checks[-1]
    assert champion.status == "skipped" and champion.reason == "skipped: no champion" and not champion.passed
    report.require_pass()  # does not raise


def test_the_interval_bound_is_the_default_and_judges_the_conservative_end():
    """The same evidence as above under the default rule: ECE's point estimate (~0) clears 0.05 but the interval's high
    end (0.09) does not, so the check fails and says why; accuracy's low end (0.72) clears 0.7 and passes."""
    preds = model_rows(100, 0.8, seed=1)
    thresholds = DecisionThresholds(min_accuracy=0.7, max_ece=0.05, max_p95_latency_ms=500.0)
    report = evaluate_gates(preds, thresholds=thresholds, champion_rule=RULE)
    assert report.decision_rule == "bound" and report.decision == "fail"
    ece = next(c for c in report.checks if c.name == "ece")
    assert ece.rule == "bound" and ece.observed < 0.05 < ece.ci[1] and ece.status == "fail"
    assert "interval high end" in ece.reason and "point estimate" in ece.reason
    accuracy = next(c for c in report.checks if c.name == "accuracy")
    assert accuracy.ci[0] >= 0.7 and accuracy.status == "pass" and "interval low end" in accuracy.reason
    stricter_floor = evaluate_gates(preds, thresholds=DecisionThresholds(min_accuracy=0.75, max_ece=0.2))
    assert stricter_floor.checks[0].observed >= 0.75 > stricter_floor.checks[0].ci[0]
    assert status(stricter_floor,
                  "accuracy") == "fail", "a point estimate above the floor is not enough under the bound"
    assert status(evaluate_gates(preds, thresholds=DecisionThresholds(min_accuracy=0.75, max_ece=0.2),
                                 decision_rule="point"), "accuracy") == "pass"
    with pytest.raises(BadInput, match="decision_rule"):
        evaluate_gates(preds, thresholds=thresholds, decision_rule="paired")


def test_the_summary_names_every_check_that_did_not_pass_and_no_thresholds_is_not_a_gate():
    from shiplift.validation.gates import summary_line

    preds = model_rows(100, 0.4, seed=2, latency=900.0)
    report = evaluate_gates(preds,
                            thresholds=DecisionThresholds(min_accuracy=0.5, max_ece=0.2, max_p95_latency_ms=500.0))
    line = summary_line(report.decision, report.to_dict()["checks"])
    assert line.startswith("fail: ") and "accuracy 0.4 (needs >= 0.5; bound" in line and "p95_latency_ms" in line
    assert "validity" not in line, "a passing check is not listed"
    adhoc = evaluate_gates(preds, thresholds=None)
    assert adhoc.decision == "not_gated" and [c.status for c in adhoc.checks] == ["skipped"]
    assert summary_line(adhoc.decision, adhoc.to_dict()["checks"]) == "no thresholds: not a gate"
    with pytest.raises(GateFailed, match="no thresholds: not a gate"):
        adhoc.require_pass()


def test_the_champion_comparison_covers_every_gated_metric_paired_on_shared_tasks():
    """Accuracy, ECE, validity and allowed-token mass paired on the shared tasks (hand-checkable: the candidate gets
    10 more of 100 right and has 0.1 less mass on every task), p95 latency side by side; each row names its gate."""
    champion = model_rows(100, 0.7, seed=20)
    candidate = [dict(r) for r in champion]
    wrong = [i for i, r in enumerate(candidate) if r["probabilities"][0] < max(r["probabilities"])][:10]
    for i in wrong:
        candidate[i] = row(candidate[i]["id"], [0.7, 0.15, 0.15], started=candidate[i]["started_at"], mass=0.8)
    for r in candidate:
        r["allowed_token_mass"], r["latency_ms"] = 0.8, r["latency_ms"] + 50.0
    report = evaluate_gates(candidate, thresholds=LOOSE, champion_preds=champion, champion_rule=RULE)
    rows = {r["metric"]: r for r in report.champion["comparison"]}
    assert list(rows) == ["accuracy", "ece", "validity", "allowed_token_mass", "p95_latency_ms"]
    assert rows["accuracy"]["difference"] == pytest.approx(0.10) and rows["accuracy"]["paired"]
    assert rows["accuracy"]["candidate"]["value"] == pytest.approx(0.8)
    assert rows["accuracy"]["champion"]["value"] == pytest.approx(0.7)
    low, high = rows["accuracy"]["difference_ci"]
    assert 0.0 < low <= 0.10 <= high, "ten more right on the same tasks: the paired interval excludes zero"
    assert rows["allowed_token_mass"]["difference"] == pytest.approx(-0.1)
    assert rows["allowed_token_mass"]["n_shared"] == 100
    assert rows["validity"]["difference"] == 0.0
    p95 = rows["p95_latency_ms"]
    champion_p95 = np.percentile([100.0 + i % 7 for i in range(1, 100)], 95)  # each side's first request apart
    assert p95["paired"] and p95["n_shared"] == 99 and p95["difference"] == pytest.approx(50.0)
    assert p95["difference_ci"] == pytest.approx([50.0, 50.0])  # 50 ms slower on every request, in every resample
    assert p95["ratio"] == pytest.approx((champion_p95 + 50.0) / champion_p95)
    assert rows["accuracy"]["gated_by"] == ["accuracy",
                                            "champion_accuracy"] and rows["p95_latency_ms"]["gated_by"] == []
    assert report.champion["metrics"]["reliability"], "the champion's own metrics are kept for the report's overlay"


def test_switched_off_checks_are_absent_and_failures_fail():
    preds = model_rows(100, 0.4, seed=2, latency=900.0)
    report = evaluate_gates(preds, thresholds=DecisionThresholds(min_accuracy=0.5, max_ece=0.2))
    assert [c.name for c in report.checks] == ["accuracy", "ece", "validity", "champion_accuracy"]
    assert status(report, "accuracy") == "fail" and report.decision == "fail"
    with pytest.raises(GateFailed, match="accuracy: fail"):
        report.require_pass()
    slow = evaluate_gates(
        preds, thresholds=DecisionThresholds(min_accuracy=0.3, max_ece=0.2, max_p95_latency_ms=500.0)
    )
    assert status(slow, "p95_latency_ms") == "fail" and slow.decision == "fail"


def test_invalid_rows_fail_validity_but_503_retries_do_not():
    preds = model_rows(60, 0.8, seed=3)
    for r in preds[:5]:
        r["retries_503"] = 2
    report = evaluate_gates(preds, thresholds=LOOSE)
    assert report.decision == "pass" and report.metrics["retries_503"] == 10
    assert report.to_dict()["metrics"]["validity"]["value"] == 1.0
    preds[6] = row(preds[6]["id"], None, error="HTTP 500 after retries")
    failed = evaluate_gates(preds, thresholds=LOOSE)
    assert status(failed, "validity") == "fail" and failed.metrics["errors"] == 1


def test_missing_measurement_fails_its_check():
    preds = model_rows(40, 0.8, seed=4)
    for r in preds:
        r["allowed_token_mass"] = None
    report = evaluate_gates(
        preds, thresholds=DecisionThresholds(min_accuracy=0.5, max_ece=0.2, min_allowed_token_mass=0.5)
    )
    check = next(c for c in report.checks if c.name == "allowed_token_mass")
    assert check.status == "fail" and check.observed is None and "no rows" in check.reason


def test_champion_equal_passes_much_worse_fails():
    champion = model_rows(200, 0.8, seed=5)
    same = evaluate_gates(champion, thresholds=LOOSE, champion_preds=champion, champion_rule=RULE)
    assert status(same, "champion_accuracy") == "pass" and same.decision == "pass"
    worse = model_rows(200, 0.6, seed=6)
    report = evaluate_gates(worse, thresholds=LOOSE, champion_preds=champion, champion_rule=RULE)
    check = next(c for c in report.checks if c.name == "champion_accuracy")
    assert check.status == "fail" and check.ci[1] < -0.02
    assert check.observed == pytest.approx(-0.2) and check.n == 200
    assert report.decision == "fail"


def test_close_call_on_small_sample_is_inconclusive_and_never_promotes():
    champion = model_rows(60, 0.8, seed=7)
    candidate = [dict(r) for r in champion]
    flipped = 0
    for r in candidate:  # candidate loses three of the champion's right answers: −5 points
        if r["probabilities"][0] > 0.5 and flipped < 3:
            r["probabilities"] = [0.1, 0.8, 0.1]
            flipped += 1
    report = evaluate_gates(candidate, thresholds=LOOSE, champion_preds=champion, champion_rule=RULE)
    check = next(c for c in report.checks if c.name == "champion_accuracy")
    assert check.status == "inconclusive", check
    assert check.ci[0] < -0.02 <= check.ci[1]
    assert report.decision == "inconclusive"
    with pytest.raises(GateFailed, match="inconclusive"):
        report.require_pass()


def test_too_few_shared_tasks_is_inconclusive():
    champion = model_rows(100, 0.8, seed=8, ids_from=0)
    candidate = model_rows(100, 0.9, seed=9, ids_from=80)  # only 20 ids shared
    report = evaluate_gates(candidate, thresholds=LOOSE, champion_preds=champion, champion_rule=RULE)
    check = next(c for c in report.checks if c.name == "champion_accuracy")
    assert check.status == "inconclusive" and check.n == 20 and "min_samples=30" in check.reason
    assert report.sample_sizes == {"candidate": 100, "candidate_valid": 100, "champion": 100, "shared": 20}
    disjoint = model_rows(50, 0.9, seed=9, ids_from=500)
    none_shared = evaluate_gates(disjoint, thresholds=LOOSE, champion_preds=champion, champion_rule=RULE)
    assert status(none_shared, "champion_accuracy") == "inconclusive" and none_shared.decision == "inconclusive"


def test_fail_beats_inconclusive():
    champion = model_rows(100, 0.8, seed=10, ids_from=0)
    candidate = model_rows(100, 0.3, seed=11, ids_from=90)  # too few shared AND below min accuracy
    report = evaluate_gates(candidate, thresholds=LOOSE, champion_preds=champion, champion_rule=RULE)
    assert status(report, "champion_accuracy") == "inconclusive" and report.decision == "fail"


def test_ece_margin_against_champion():
    champion = model_rows(200, 0.7, seed=12)  # calibrated
    overconfident = [dict(r) for r in champion]
    for r in overconfident:
        top = 0.98 if r["probabilities"][0] > 0.5 else 0.01
        r["probabilities"] = [top, 1 - top - 0.01, 0.01]
    rule = ChampionRule(n_bootstrap=300, also_ece_margin=0.05)
    report = evaluate_gates(
        overconfident, thresholds=DecisionThresholds(min_accuracy=0.5, max_ece=1.0),
        champion_preds=champion, champion_rule=rule,
    )
    assert status(report, "champion_accuracy") == "pass"
    assert status(report, "champion_ece") == "fail" and report.decision == "fail"
    assert report.champion["ece"]["difference"] > 0.05


def test_champion_without_rule_and_mismatched_metrics_are_refused():
    preds = model_rows(40, 0.8, seed=13)
    with pytest.raises(BadInput, match="champion rule"):
        evaluate_gates(preds, thresholds=LOOSE, champion_preds=preds)
    other = decision_metrics(model_rows(41, 0.8, seed=13), n_bootstrap=100)
    with pytest.raises(BadInput, match="41 rows"):
        evaluate_gates(preds, thresholds=LOOSE, candidate_metrics=other)


def test_precomputed_metrics_are_used_as_given():
    preds = model_rows(50, 0.8, seed=14)
    metrics = decision_metrics(preds, n_bootstrap=123, seed=5)
    report = evaluate_gates(preds, thresholds=LOOSE, candidate_metrics=metrics)
    assert report.metrics == metrics and report.metrics["bootstrap"]["n_bootstrap"] == 123


def paired_ece_ci(report) -> list[float]:
    """The paired bootstrap interval of ECE candidate − champion in a report's comparison."""
    return next(row for row in report.champion["comparison"] if row["metric"] == "ece")["difference_ci"]


def test_the_run_bootstrap_sets_the_candidates_intervals_and_the_rule_its_champion_comparison():
    """`validation.n_bootstrap`/`seed` (passed in) set the candidate's own intervals; the champion rule's own
    `n_bootstrap`/`seed` set the paired comparison, and both are recorded."""
    candidate, champion = model_rows(60, 0.8, seed=16), model_rows(60, 0.6, seed=17)
    report = evaluate_gates(
        candidate, thresholds=LOOSE, champion_preds=champion, champion_rule=RULE, n_bootstrap=150, seed=3
    )
    assert report.bootstrap["n_bootstrap"] == 150 and report.bootstrap["seed"] == 3
    assert report.metrics["bootstrap"]["n_bootstrap"] == 150 and report.metrics["bootstrap"]["seed"] == 3
    assert report.bootstrap["champion_comparison"] == {"n_bootstrap": RULE.n_bootstrap, "seed": RULE.seed,
                                                       "confidence": RULE.confidence}
    default = evaluate_gates(candidate, thresholds=LOOSE, champion_preds=champion, champion_rule=RULE)
    assert default.bootstrap["n_bootstrap"] == 300
    assert default.metrics["accuracy"]["ci"] != report.metrics["accuracy"]["ci"]
    assert paired_ece_ci(default) == paired_ece_ci(report), "the comparison is the rule's"
    reseeded = evaluate_gates(candidate, thresholds=LOOSE, champion_preds=champion,
                              champion_rule=RULE.model_copy(update={"seed": RULE.seed + 1}), n_bootstrap=150, seed=3)
    assert paired_ece_ci(reseeded) != paired_ece_ci(report), "the rule's seed is honoured"
    assert reseeded.champion["accuracy"]["ci"] == report.champion["accuracy"]["ci"], "the score interval resamples none"
    assert reseeded.metrics["accuracy"]["ci"] == report.metrics["accuracy"]["ci"]
    assert evaluate_gates(candidate, thresholds=LOOSE).bootstrap["champion_comparison"] is None
    with pytest.raises(BadInput, match="n_bootstrap"):
        evaluate_gates(champion, thresholds=LOOSE, n_bootstrap=10)


def test_to_dict_is_json_and_records_exact_thresholds():
    champion = model_rows(60, 0.8, seed=15)
    thresholds = DecisionThresholds(min_accuracy=0.61, max_ece=0.137, max_p95_latency_ms=250.5)
    # the champion against itself: no task differs, so the score interval is ±z²/(60 + z²) = ±0.06, inside margin 0.1
    rule = RULE.model_copy(update={"margin": 0.1})
    data = evaluate_gates(champion, thresholds=thresholds, champion_preds=champion, champion_rule=rule).to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert data["thresholds"] == {
        "min_accuracy": 0.61, "max_ece": 0.137, "min_validity": 1.0, "max_p95_latency_ms": 250.5,
        "min_allowed_token_mass": None,
    }
    assert data["champion_rule"]["margin"] == 0.1 and data["champion"]["present"] is True
    assert data["champion"]["accuracy"]["n"] == 60 and data["decision"] == "pass"
    fields = {"name", "status", "observed", "threshold", "comparator", "ci", "n", "passed"}
    assert all(fields <= set(check) for check in data["checks"])
