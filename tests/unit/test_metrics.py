"""Metrics against hand-computed values, an independent ECE loop and scikit-learn."""

from __future__ import annotations

import inspect
import json
import math
import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from shiplift.tasks.errors import BadInput
from shiplift.validation.metrics import (
    NLL_CLIP,
    accuracy,
    bootstrap_ci,
    decision_metrics,
    expected_calibration_error,
    latency_summary,
    macro_f1,
    multiclass_brier,
    negative_log_likelihood,
    paired_accuracy_difference,
    per_class_recall,
    predict_label,
    probabilities_valid,
    reliability_table,
    score_predictions,
    validity,
)

OPTIONS = ["a", "b", "c"]


def row(ident, probs, expected="a", options=OPTIONS, *, error=None, latency=100.0, started=0.0, retries=0, mass=0.9):
    return {
        "id": ident, "dataset": "unit", "expected": expected, "option_ids": list(options), "probabilities": probs,
        "option_logits": None, "allowed_token_mass": mass, "temperature": 1.0, "latency_ms": latency,
        "server_forward_ms": None, "server_total_ms": None, "attempts": 1 + retries, "retries_503": retries,
        "error": error, "started_at": started,
    }


def random_rows(n, seed, *, k=3, sharpness=1.0):
    rng = np.random.default_rng(seed)
    options = [f"o{i}" for i in range(k)]
    rows = []
    for i in range(n):
        probs = rng.dirichlet([sharpness] * k)
        expected = options[rng.integers(k)]
        rows.append(row(f"t{i:05d}", probs.tolist(), expected, options, latency=float(rng.gamma(4, 25)), started=i))
    return rows


def loop_ece(confidence, correct, n_bins=10):
    """ECE written the slow way: bins by explicit comparison of each row against fractional edges."""
    totals = {b: [0, 0.0, 0.0] for b in range(n_bins)}
    for c, ok in zip(confidence, correct, strict=True):
        b = next(k for k in range(n_bins) if c <= (k + 1) / n_bins)
        totals[b][0] += 1
        totals[b][1] += c
        totals[b][2] += ok
    n = len(confidence)
    return sum(abs(s_ok / cnt - s_c / cnt) * cnt / n for cnt, s_c, s_ok in totals.values() if cnt)


# ------------------------------------------------------------------------------------------ hand-computed


def test_small_case_by_hand():
    preds = [
        row("t1", [0.7, 0.2, 0.1], "a"),  # correct, brier .09+.04+.01=.14, nll -ln .7
        row("t2", [0.2, 0.5, 0.3], "c"),  # wrong, brier .04+.25+.49=.78, nll -ln .3
        row("t3", None, "a", error="timeout"),  # invalid -> wrong, out of calibration
        row("t4", [0.1, 0.1, 0.8], "c"),  # correct, brier .01+.01+.04=.06, nll -ln .8
    ]
    m = decision_metrics(preds, n_bootstrap=200)
    assert m["n"] == 4 and m["n_valid"] == 3 and m["errors"] == 1
    assert m["accuracy"]["value"] == pytest.approx(2 / 4)
    assert m["validity"]["value"] == pytest.approx(3 / 4)
    assert m["brier"]["value"] == pytest.approx((0.14 + 0.78 + 0.06) / 3)
    assert m["nll"]["value"] == pytest.approx(-(math.log(0.7) + math.log(0.3) + math.log(0.8)) / 3)
    # ECE bins: .7 -> (0.6,0.7] acc 1; .5 -> (0.4,0.5] acc 0; .8 -> (0.7,0.8] acc 1
    assert m["ece"]["value"] == pytest.approx((0.3 + 0.5 + 0.2) / 3)
    assert m["ece"]["n"] == 3
    assert m["allowed_token_mass"]["value"] == pytest.approx(0.9)


def test_hand_worked_ece_and_reliability_with_bin_edges():
    confidence = np.array([0.95, 0.95, 0.65, 0.35, 0.3, 1.0, 0.1])
    correct = np.array([1, 0, 1, 1, 0, 1, 0], dtype=bool)
    # bins: 9: {.95,.95,1.0} acc 2/3 conf 2.9/3; 6: {.65} acc 1; 3: {.35} acc 1; 2: {.3} acc 0; 0: {.1} acc 0
    expected = (
        abs(2 / 3 - 2.9 / 3) * 3 + abs(1 - 0.65) + abs(1 - 0.35) + abs(0 - 0.3) + abs(0 - 0.1)
    ) / 7
    assert expected_calibration_error(confidence, correct) == pytest.approx(expected)
    table = reliability_table(confidence, correct)
    counts = [b["count"] for b in table]
    assert counts == [1, 0, 1, 1, 0, 0, 1, 0, 0, 3]
    assert table[2]["lower"] == pytest.approx(0.2) and table[2]["mean_confidence"] == pytest.approx(0.3)
    assert table[9]["accuracy"] == pytest.approx(2 / 3)
    assert table[1]["accuracy"] is None and table[1]["mean_confidence"] is None


def test_ece_matches_independent_loop_on_random_data():
    rng = np.random.default_rng(7)
    confidence = np.concatenate([rng.uniform(0.2, 1.0, 500), np.arange(1, 11) / 10])  # include exact edges
    correct = rng.uniform(size=confidence.size) < confidence ** 2
    assert expected_calibration_error(confidence, correct) == pytest.approx(loop_ece(confidence, correct), abs=1e-12)
    table = reliability_table(confidence, correct)
    assert sum(b["count"] for b in table) == confidence.size


def test_perfectly_calibrated_bins_have_zero_ece():
    confidence = np.array([0.75] * 4 + [0.5] * 2)
    correct = np.array([1, 1, 1, 0, 1, 0], dtype=bool)
    assert expected_calibration_error(confidence, correct) == pytest.approx(0.0)


def test_tie_goes_to_lexicographically_smallest_label():
    assert predict_label(["yes", "no"], [0.5, 0.5]) == "no"
    assert predict_label(["c", "b", "a"], [0.4, 0.4, 0.2]) == "b"
    preds = [row("t1", [0.5, 0.5], "no", ["yes", "no"]), row("t2", [0.5, 0.5], "yes", ["yes", "no"])]
    assert accuracy(preds) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "probs",
    [
        None,
        [0.5, 0.5],  # one option short
        [0.5, 0.5, 0.0, 0.0],  # one option too many
        [float("nan"), 0.5, 0.5],
        [float("inf"), 0.0, 0.0],
        [-0.01, 0.51, 0.5],
        [1.2, -0.1, -0.1],
        [0.5, 0.3, 0.23],  # sums to 1.03
        [0.5, 0.3, 0.17],  # sums to 0.97
        ["0.5", 0.3, 0.2],
        [True, 0.0, 0.0],
        "0.3,0.3,0.4",
    ],
)
def test_invalid_probabilities_are_invalid_and_wrong(probs):
    assert not probabilities_valid(probs, 3)
    preds = [row("bad", probs, "a"), row("good", [0.9, 0.05, 0.05], "a")]
    assert validity(preds) == pytest.approx(0.5)
    assert accuracy(preds) == pytest.approx(0.5)


def test_sum_tolerance_is_two_percent_and_error_rows_are_invalid():
    assert probabilities_valid([0.5, 0.3, 0.219], 3)
    assert probabilities_valid([0.5, 0.3, 0.181], 3)
    preds = [row("t", [0.9, 0.05, 0.05], "a", error="HTTP 500")]
    assert validity(preds) == 0.0 and accuracy(preds) == 0.0


def test_503_retries_are_counted_not_scored():
    preds = [row("t1", [0.9, 0.05, 0.05], "a", retries=3), row("t2", [0.1, 0.8, 0.1], "b", retries=1)]
    m = decision_metrics(preds, n_bootstrap=100)
    assert m["retries_503"] == 4
    assert m["validity"]["value"] == 1.0 and m["accuracy"]["value"] == 1.0 and m["errors"] == 0


def test_brier_and_nll_definitions_by_hand():
    assert multiclass_brier([[0.7, 0.2, 0.1], [0.5, 0.5]], [0, 1]) == pytest.approx((0.14 + 0.5) / 2)
    assert negative_log_likelihood([[0.25, 0.75]], [1]) == pytest.approx(-math.log(0.75))
    # a zero on the true label is clipped at 1e-12, not infinite
    assert negative_log_likelihood([[1.0, 0.0]], [1]) == pytest.approx(-math.log(NLL_CLIP))


def test_macro_f1_and_recall_by_hand():
    y_true = ["e", "e", "n", "n", "c", "c"]
    y_pred = ["e", "n", "n", "n", "e", None]  # None = invalid prediction: a miss, not a false positive
    recall = per_class_recall(y_true, y_pred, ["e", "n", "c", "x"])
    assert recall == {"e": 0.5, "n": 1.0, "c": 0.0, "x": None}
    # F1: e tp1 fp1 fn1 -> .5; n tp2 fp1 fn0 -> .8; c tp0 fp0 fn2 -> 0
    assert macro_f1(y_true, y_pred, ["e", "n", "c"]) == pytest.approx((0.5 + 0.8 + 0.0) / 3)


# ------------------------------------------------------------------------------------------ scikit-learn


def test_against_scikit_learn():
    sk = pytest.importorskip("sklearn.metrics", reason="scikit-learn is a dev dependency of the reference checks")
    preds = random_rows(300, seed=3, k=4, sharpness=0.7)
    scored = score_predictions(preds)
    options = preds[0]["option_ids"]
    y_true = [p["expected"] for p in preds]
    y_pred = scored.predicted
    probs = np.array([p["probabilities"] for p in preds])
    probs = probs / probs.sum(axis=1, keepdims=True)
    true_index = [options.index(y) for y in y_true]

    assert accuracy(preds) == pytest.approx(sk.accuracy_score(y_true, y_pred))
    assert macro_f1(y_true, y_pred, options) == pytest.approx(
        sk.f1_score(y_true, y_pred, labels=options, average="macro", zero_division=0)
    )
    recall = per_class_recall(y_true, y_pred, options)
    assert [recall[o] for o in options] == pytest.approx(
        list(sk.recall_score(y_true, y_pred, labels=options, average=None, zero_division=0))
    )
    assert negative_log_likelihood(probs, true_index) == pytest.approx(sk.log_loss(y_true, probs, labels=options))
    # binary: the multi-class Brier is twice sklearn's binary Brier score
    p_yes = probs[:, 0] / (probs[:, 0] + probs[:, 1])
    binary = np.stack([1 - p_yes, p_yes], axis=1)
    y_bin = np.array(true_index) % 2 == 0
    assert multiclass_brier(binary, [1 if y else 0 for y in y_bin]) == pytest.approx(
        2 * sk.brier_score_loss(y_bin, p_yes)
    )
    if "scale_by_half" in inspect.signature(sk.brier_score_loss).parameters:  # multi-class form: sklearn >= 1.7
        assert multiclass_brier(probs, true_index) == pytest.approx(
            sk.brier_score_loss(y_true, probs, labels=options, scale_by_half=False)
        )


def test_macro_f1_against_scikit_learn_with_missing_class_and_invalid_predictions():
    sk = pytest.importorskip("sklearn.metrics", reason="scikit-learn is a dev dependency of the reference checks")
    labels = ["entailment", "neutral", "contradiction"]
    rng = random.Random(5)
    y_true = [rng.choice(labels[:2]) for _ in range(200)]  # contradiction never true
    y_pred = [rng.choice(labels + ["<invalid>"]) for _ in range(200)]
    ours = macro_f1(y_true, [None if p == "<invalid>" else p for p in y_pred], labels)
    assert ours == pytest.approx(sk.f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0))


# ------------------------------------------------------------------------------------------ latency


def test_latency_first_apart_warmup_excluded_and_linear_percentiles():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    latencies = [900.0, 50.0, 40.0] + [float(v) for v in range(10, 110, 10)]
    preds = [
        row(f"t{i}", [0.9, 0.05, 0.05], started=(t0 + timedelta(seconds=i)).isoformat(), latency=lat)
        for i, lat in enumerate(latencies)
    ]
    preds.append(row("failed", None, error="timeout", started=(t0 - timedelta(seconds=5)).isoformat(), latency=5e4))
    random.Random(1).shuffle(preds)
    summary = latency_summary(preds, warmup=2, n_bootstrap=200)
    steady = np.array(latencies[3:])
    assert summary["first_ms"] == 900.0 and summary["first_id"] == "t0"
    assert summary["n_successful"] == 13 and summary["n"] == 10 and summary["warmup"] == 2
    for q in (50, 90, 95, 99):
        assert summary[f"p{q}"]["value"] == pytest.approx(np.percentile(steady, q))
    assert summary["p95"]["value"] == pytest.approx(95.5)  # linear: 10..100 step 10
    assert summary["mean"]["value"] == pytest.approx(55.0)
    lo, hi = summary["p50"]["ci"]
    assert lo <= summary["p50"]["value"] <= hi


def test_latency_refuses_bad_started_at_and_warmup():
    with pytest.raises(BadInput, match="started_at"):
        latency_summary([row("t", [0.9, 0.05, 0.05], started="yesterday")])
    with pytest.raises(BadInput, match="warmup"):
        latency_summary([row("t", [0.9, 0.05, 0.05])], warmup=-1)


# ------------------------------------------------------------------------------------------ bootstrap


def test_bootstrap_contains_estimate_narrows_and_is_seeded():
    small = decision_metrics(random_rows(60, seed=1), n_bootstrap=500, seed=11)
    large = decision_metrics(random_rows(3000, seed=2), n_bootstrap=500, seed=11)
    for m in (small, large):
        for name in ("accuracy", "brier", "nll"):
            lo, hi = m[name]["ci"]
            assert lo <= m[name]["value"] <= hi
    for name in ("accuracy", "brier", "nll", "ece"):
        width_small = small[name]["ci"][1] - small[name]["ci"][0]
        width_large = large[name]["ci"][1] - large[name]["ci"][0]
        assert width_large < width_small / 3
    again = decision_metrics(random_rows(60, seed=1), n_bootstrap=500, seed=11)
    assert again == small
    other_seed = decision_metrics(random_rows(60, seed=1), n_bootstrap=500, seed=12)
    assert other_seed["accuracy"]["value"] == small["accuracy"]["value"]
    assert other_seed["brier"]["ci"] != small["brier"]["ci"]


def test_bootstrap_ci_of_constant_is_the_constant_and_bad_args_refused():
    values = np.full(20, 0.25)
    assert bootstrap_ci(lambda idx: float(values[idx].mean()), 20, n_bootstrap=50) == pytest.approx([0.25, 0.25])
    assert bootstrap_ci(lambda idx: 0.0, 0) is None
    with pytest.raises(BadInput):
        bootstrap_ci(lambda idx: 0.0, 5, n_bootstrap=0)
    with pytest.raises(BadInput):
        bootstrap_ci(lambda idx: 0.0, 5, confidence=1.5)


def test_paired_difference_uses_shared_ids_regardless_of_order():
    champion = random_rows(80, seed=4)
    candidate = [dict(r) for r in champion[:50]]
    for r in candidate[:10]:  # make the candidate wrong on ten tasks the champion may have got right
        options = r["option_ids"]
        wrong = next(o for o in options if o != r["expected"])
        r["probabilities"] = [0.98 if o == wrong else 0.01 for o in options]
    shuffled = champion[::-1]
    a = paired_accuracy_difference(score_predictions(candidate), score_predictions(champion))
    b = paired_accuracy_difference(score_predictions(candidate), score_predictions(shuffled))
    assert a == b and a["n"] == 50
    cand_acc = np.mean(score_predictions(candidate).correct)
    champ_acc = np.mean(score_predictions(champion[:50]).correct)
    assert a["difference"] == pytest.approx(cand_acc - champ_acc)
    assert a["ci"][0] <= a["difference"] <= a["ci"][1]
    same = paired_accuracy_difference(score_predictions(champion), score_predictions(shuffled))
    # no task answered differently: the score interval is ±z²/(n + z²), not the bootstrap's [0, 0]
    edge = 1.959964**2 / (80 + 1.959964**2)
    assert same["difference"] == 0.0 and same["ci"] == pytest.approx([-edge, edge], abs=1e-6)


# ------------------------------------------------------------------------------------------ shape and input


def test_decision_metrics_shape_is_json_able():
    m = decision_metrics(random_rows(40, seed=9), n_bootstrap=100, warmup=1)
    text = json.dumps(m, allow_nan=False)
    assert json.loads(text) == m
    for name in ("accuracy", "validity", "ece", "brier", "nll", "allowed_token_mass"):
        assert set(m[name]) == {"value", "ci", "n"}
    assert len(m["reliability"]) == 10 and m["latency_ms"]["n"] == 38


def test_no_valid_rows_gives_none_calibration():
    m = decision_metrics([row("t", None, error="boom")], n_bootstrap=50)
    assert m["n_valid"] == 0 and m["accuracy"]["value"] == 0.0
    assert m["ece"] == {"value": None, "ci": None, "n": 0} and m["latency_ms"]["first_ms"] is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("probabilities"), "missing keys"),
        (lambda r: r.update(expected="z"), "not one of option_ids"),
        (lambda r: r.update(option_ids=["a", "a", "b"]), "duplicates"),
        (lambda r: r.update(retries_503=-1), "retries_503"),
        (lambda r: r.update(id=""), "id must be"),
    ],
)
def test_malformed_rows_are_refused(mutate, message):
    bad = row("t", [0.9, 0.05, 0.05])
    mutate(bad)
    with pytest.raises(BadInput, match=message):
        score_predictions([bad])


def test_duplicate_ids_and_empty_input_refused():
    with pytest.raises(BadInput, match="duplicate id"):
        score_predictions([row("t", [0.9, 0.05, 0.05]), row("t", [0.9, 0.05, 0.05])])
    with pytest.raises(BadInput, match="no predictions"):
        decision_metrics([])
