"""Temperature scaling: recovers a known temperature, never worsens NLL, shrinks ECE."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shiplift.tasks.errors import BadInput
from shiplift.validation.calibration import apply_temperature, fit_temperature
from shiplift.validation.metrics import expected_calibration_error


def synthetic(n, k, temperature, seed):
    """Logits whose labels follow softmax(z) but which are reported as z * temperature."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.5, size=(n, k))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    labels = [int(rng.choice(k, p=row)) for row in p]
    return (z * temperature).tolist(), labels


def nll(logits, labels, temperature):
    probs = apply_temperature(logits, temperature)
    return -float(np.mean([math.log(p[y]) for p, y in zip(probs, labels, strict=True)]))


def ece_of(logits, labels, temperature):
    probs = np.array(apply_temperature(logits, temperature))
    conf = probs.max(axis=1)
    correct = probs.argmax(axis=1) == np.array(labels)
    return expected_calibration_error(conf, correct)


@pytest.mark.parametrize("true_t", [0.5, 2.5])
def test_recovers_known_temperature_within_five_percent(true_t):
    logits, labels = synthetic(4000, 4, true_t, seed=1)
    fit = fit_temperature(logits, labels)
    assert fit.temperature == pytest.approx(true_t, rel=0.05)
    assert fit.converged and not fit.at_bound and fit.n == 4000
    assert fit.nll_after < fit.nll_before
    assert fit.nll_before == pytest.approx(nll(logits, labels, 1.0))
    assert fit.nll_after == pytest.approx(nll(logits, labels, fit.temperature))


@pytest.mark.parametrize("seed", range(4))
def test_fitted_temperature_never_increases_nll(seed):
    rng = np.random.default_rng(100 + seed)
    true_t = float(rng.choice([0.3, 1.0, 1.0, 3.0]))
    logits, labels = synthetic(int(rng.integers(10, 200)), int(rng.integers(2, 6)), true_t, seed=seed)
    fit = fit_temperature(logits, labels)
    assert fit.nll_after <= fit.nll_before
    for t in (0.5, 0.9, 1.1, 2.0):  # and it is at least as good as nearby temperatures
        assert fit.nll_after <= nll(logits, labels, t) + 1e-9


def test_ece_drops_on_overconfident_set():
    logits, labels = synthetic(2000, 5, 3.0, seed=2)  # reported logits 3x too sharp
    fit = fit_temperature(logits, labels)
    before, after = ece_of(logits, labels, 1.0), ece_of(logits, labels, fit.temperature)
    assert fit.temperature > 2.0
    assert before > 0.15 and after < before / 3


def test_ragged_option_counts_are_supported():
    logits_a, labels_a = synthetic(300, 2, 2.0, seed=3)
    logits_b, labels_b = synthetic(300, 5, 2.0, seed=4)
    fit = fit_temperature(logits_a + logits_b, labels_a + labels_b)
    assert fit.temperature == pytest.approx(2.0, rel=0.15)
    assert fit.nll_after == pytest.approx(
        (nll(logits_a, labels_a, fit.temperature) + nll(logits_b, labels_b, fit.temperature)) / 2
    )


def test_optimum_beyond_bounds_is_reported_at_bound():
    logits = [[10.0, 0.0]] * 20  # always right with a wide margin: NLL keeps falling as T -> 0
    fit = fit_temperature(logits, [0] * 20, bounds=(0.5, 4.0))
    assert fit.at_bound and fit.temperature == pytest.approx(0.5, rel=1e-3)
    assert fit.bounds == (0.5, 4.0)


@pytest.mark.parametrize(
    ("logits", "labels", "message"),
    [
        ([[1.0, 0.0]] * 9, [0] * 9, "at least 10"),
        ([[1.0, 0.0]] * 10, [0] * 9, "expected indices"),
        ([[1.0, float("nan")]] + [[1.0, 0.0]] * 9, [0] * 10, "non-finite"),
        ([[1.0, float("inf")]] + [[1.0, 0.0]] * 9, [0] * 10, "non-finite"),
        ([[1.0]] + [[1.0, 0.0]] * 9, [0] * 10, "at least 2"),
        ([[1.0, 0.0]] * 10, [2] + [0] * 9, "not an option index"),
        ([[1.0, 0.0]] * 10, [True] + [0] * 9, "not an option index"),
    ],
)
def test_bad_input_is_refused(logits, labels, message):
    with pytest.raises(BadInput, match=message):
        fit_temperature(logits, labels)


def test_bad_bounds_refused():
    with pytest.raises(BadInput, match="bounds"):
        fit_temperature([[1.0, 0.0]] * 10, [0] * 10, bounds=(0.0, 5.0))
    with pytest.raises(BadInput, match="bounds"):
        fit_temperature([[1.0, 0.0]] * 10, [0] * 10, bounds=(5.0, 2.0))


def test_apply_temperature():
    probs = apply_temperature([2.0, 1.0, 0.0], 1.0)
    expected = np.exp([2.0, 1.0, 0.0]) / np.exp([2.0, 1.0, 0.0]).sum()
    assert probs == pytest.approx(expected.tolist())
    hot = apply_temperature([2.0, 1.0, 0.0], 4.0)
    assert max(hot) < max(probs) and sum(hot) == pytest.approx(1.0)
    rows = apply_temperature([[1000.0, 0.0], [0.0, 0.0, 0.0]], 0.5)  # large logits stay finite
    assert rows[0] == pytest.approx([1.0, 0.0]) and rows[1] == pytest.approx([1 / 3] * 3)
    for bad_t in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(BadInput, match="temperature"):
            apply_temperature([1.0, 0.0], bad_t)
    with pytest.raises(BadInput, match="non-finite"):
        apply_temperature([1.0, float("nan")], 1.0)
