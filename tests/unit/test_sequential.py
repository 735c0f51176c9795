"""validation.sequential: the betting confidence sequence's error rates, checked by seeded simulation of paired tasks
(drawn task by task, not from the formula), and its refusals of bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shiplift.tasks.errors import BadInput
from shiplift.validation.sequential import extension_looks, sequential_champion_check


def paired_tasks(rng, n: int, disagreement: float, difference: float) -> np.ndarray:
    """candidate − champion per task: +1 (only the candidate right), −1 (only the champion), 0 (they agree)."""
    up, down = (disagreement + difference) / 2, (disagreement - difference) / 2
    return rng.choice([1.0, -1.0, 0.0], size=n, p=[up, down, 1.0 - up - down])


def outcomes(*, disagreement, difference, margin, looks, reps, seed, higher_is_better=True):
    rng = np.random.default_rng(seed)
    counts = {"pass": 0, "fail": 0, "inconclusive": 0}
    for _ in range(reps):
        d = paired_tasks(rng, looks[-1], disagreement, difference)
        result = sequential_champion_check(d if higher_is_better else -d, margin=margin, looks=looks,
                                           higher_is_better=higher_is_better)
        counts[result.status] += 1
    return {status: count / reps for status, count in counts.items()}


def naive_pass_rate(*, disagreement, difference, margin, looks, reps, seed) -> float:
    """The same looks judged by a fixed-size 95 % normal interval each time: what the sequence guards against."""
    rng = np.random.default_rng(seed)
    passed = 0
    for _ in range(reps):
        d = paired_tasks(rng, looks[-1], disagreement, difference)
        for n in looks:
            seen = d[:n]
            if seen.mean() - 1.96 * seen.std(ddof=1) / math.sqrt(n) >= -margin:
                passed += 1
                break
    return passed / reps


LOOKS = extension_looks(100, batch=10, max_tasks=900)  # 90 looks after a first gate of 100 tasks


@pytest.mark.parametrize("disagreement", [0.08, 0.30])
def test_a_candidate_worse_by_the_margin_passes_at_most_alpha_over_two_however_many_looks(disagreement):
    rates = outcomes(disagreement=disagreement, difference=-0.05, margin=0.05, looks=LOOKS, reps=300, seed=7)
    assert rates["pass"] <= 0.025
    # the same data read with a fixed-size interval at every look passes it far more often than alpha/2
    assert naive_pass_rate(disagreement=disagreement, difference=-0.05, margin=0.05, looks=LOOKS, reps=300,
                           seed=7) > 0.05


def test_a_candidate_worse_than_the_margin_fails_and_never_passes():
    rates = outcomes(disagreement=0.12, difference=-0.10, margin=0.05, looks=LOOKS, reps=200, seed=3)
    assert rates["pass"] == 0.0
    assert rates["fail"] >= 0.95


def test_an_equal_candidate_passes_with_power_and_is_almost_never_failed():
    rates = outcomes(disagreement=0.08, difference=0.0, margin=0.05, looks=LOOKS, reps=200, seed=5)
    assert rates["pass"] >= 0.9
    assert rates["fail"] <= 0.025


def test_lower_is_better_mirrors_the_sign():
    # a lower-is-better difference that is truly +margin (worse) must pass no more than alpha/2
    rates = outcomes(disagreement=0.08, difference=-0.05, margin=0.05, looks=LOOKS, reps=200, seed=11,
                     higher_is_better=False)
    assert rates["pass"] <= 0.025
    result = sequential_champion_check([-1.0] * 50 + [0.0] * 950, margin=0.05, looks=[1000], higher_is_better=False)
    assert result.status == "pass"
    assert result.interval[0] <= -0.05 <= result.interval[1] and result.interval[1] < 0.05


def test_it_stops_at_the_first_look_that_decides_and_reports_its_interval():
    d = np.zeros(600)  # identical answers: the mean difference is 0, well inside a 0.05 margin
    result = sequential_champion_check(d, margin=0.05, looks=[100, 200, 300, 600])
    assert result.status == "pass" and result.looks <= 3 and result.n == [100, 200, 300][result.looks - 1]
    assert result.interval[0] > -0.05 and result.interval[0] <= 0.0 <= result.interval[1]
    undecided = sequential_champion_check(np.tile([1.0, -1.0], 50), margin=0.01, looks=[50, 100])
    assert (undecided.status, undecided.n, undecided.looks) == ("inconclusive", 100, 2)
    assert undecided.interval[0] < -0.01 < undecided.interval[1]


def test_extension_looks():
    assert extension_looks(231, batch=100, max_tasks=250) == [331, 431, 481]
    assert extension_looks(10, batch=5, max_tasks=10) == [15, 20]
    assert extension_looks(0, batch=50, max_tasks=20) == [20]


@pytest.mark.parametrize("kwargs", [
    {"differences": [2.0], "looks": [1]},
    {"differences": [float("nan")], "looks": [1]},
    {"differences": [0.0, 0.0], "looks": [2, 1]},
    {"differences": [0.0], "looks": [2]},
    {"differences": [0.0], "looks": []},
    {"differences": [0.0], "looks": [1], "margin": 1.5},
    {"differences": [0.0], "looks": [1], "confidence": 1.0},
])
def test_bad_input_is_refused(kwargs):
    with pytest.raises(BadInput):
        sequential_champion_check(**{"margin": 0.05, **kwargs})
    with pytest.raises(BadInput):
        extension_looks(10, batch=0, max_tasks=10)
