"""The champion accuracy check's interval (`validation.metrics.paired_score_interval`, Tango 1998): against an
independent numeric implementation, a published worked example, closed forms of its degenerate tables, and a seeded
simulation of its one-sided error next to the percentile bootstrap it replaced."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import norm

from shiplift.tasks.errors import BadInput
from shiplift.validation.gates import evaluate_gates
from shiplift.validation.metrics import (
    PAIRED_ACCURACY_METHOD,
    paired_accuracy_difference,
    paired_bootstrap,
    paired_score_interval,
    score_predictions,
)
from shiplift.validation.thresholds import ChampionRule

Z95 = norm.ppf(0.975)


def reference_statistic(gained: int, lost: int, n: int, delta: float) -> float:
    """The score statistic computed independently: the lost cell's probability p21 maximising the multinomial
    likelihood under p12 − p21 = delta found numerically (not by the quadratic's root), then
    (gained − lost − n·delta) / √(n·(p12 + p21 − delta²)), the variance of gained − lost under that fit."""
    concordant = n - gained - lost
    low, high = max(0.0, -delta), (1.0 - delta) / 2.0

    def minus_log_likelihood(p21: float) -> float:
        total = 0.0
        for count, p in ((gained, p21 + delta), (lost, p21), (concordant, 1.0 - 2.0 * p21 - delta)):
            if count:
                total -= count * math.log(max(p, 1e-300))
        return total

    fit = minimize_scalar(minus_log_likelihood, bounds=(low, high), method="bounded",
                          options={"xatol": 1e-13, "maxiter": 2000})
    p21 = fit.x
    variance = n * ((p21 + delta) + p21 - delta**2)
    return (gained - lost - n * delta) / math.sqrt(variance)


def reference_interval(gained: int, lost: int, n: int, z: float = Z95) -> list[float]:
    """Where the independent statistic crosses ±z, by Brent's method on (−1, point) and (point, 1)."""
    point = (gained - lost) / n
    edge = 1e-9
    low = -1.0 if point <= -1.0 + edge else brentq(lambda d: reference_statistic(gained, lost, n, d) - z,
                                                    -1.0 + edge, point, xtol=1e-12)
    high = 1.0 if point >= 1.0 - edge else brentq(lambda d: reference_statistic(gained, lost, n, d) + z,
                                                   point, 1.0 - edge, xtol=1e-12)
    return [low, high]


@pytest.mark.parametrize("gained, lost, n", [(0, 12, 111), (3, 8, 50), (12, 4, 100), (5, 5, 10), (2, 9, 231),
                                             (1, 0, 7), (30, 2, 40)])
def test_the_score_interval_matches_an_independent_numeric_inversion(gained, lost, n):
    assert paired_score_interval(gained, lost, n) == pytest.approx(reference_interval(gained, lost, n), abs=2e-6)


def test_the_score_interval_matches_a_published_example():
    # Cavo et al. (2012) complete response before/after consolidation, table [[59, 6], [16, 80]]: estimate −0.0621,
    # Tango asymptotic score 95 % CI −0.1240 to −0.0054 (Fagerland, Lydersen & Laake, "Statistical Analysis of
    # Contingency Tables", ch. 8; the R package contingencytables' test of Tango_asymptotic_score_CI_paired_2x2).
    low, high = paired_score_interval(6, 16, 161)
    assert (round(low, 4), round(high, 4)) == (-0.1240, -0.0054)


def test_degenerate_tables_have_closed_form_ends_and_no_nan():
    # no discordant task: the statistic is ∓√(n|δ|/(1 − |δ|)), so the ends are ±z²/(n + z²) (a bootstrap says [0, 0])
    for n in (1, 2, 111):
        edge = Z95**2 / (n + Z95**2)
        assert paired_score_interval(0, 0, n) == pytest.approx([-edge, edge], abs=1e-9)
    # every task gained: the statistic is √(n(1 − δ)/(1 + δ)), so the low end is (n − z²)/(n + z²) and the high one 1
    for n in (1, 10, 111):
        assert paired_score_interval(n, 0, n) == pytest.approx([(n - Z95**2) / (n + Z95**2), 1.0], abs=1e-9)
        assert paired_score_interval(0, n, n) == pytest.approx([-1.0, -(n - Z95**2) / (n + Z95**2)], abs=1e-9)
    for n in range(1, 9):
        for gained in range(n + 1):
            for lost in range(n + 1 - gained):
                low, high = paired_score_interval(gained, lost, n)
                assert math.isfinite(low) and math.isfinite(high)
                assert -1.0 <= low <= (gained - lost) / n <= high <= 1.0


def test_the_score_interval_refuses_a_table_that_cannot_be():
    for gained, lost, n in ((3, 2, 4), (-1, 0, 5), (0, 0, 0)):
        with pytest.raises(BadInput, match="paired"):
            paired_score_interval(gained, lost, n)
    with pytest.raises(BadInput, match="confidence"):
        paired_score_interval(1, 2, 10, confidence=1.0)


DRAWS = 4000  # seeded gates per case: a rate's standard error is at most 0.0025 at the 2.5 % it is judged against
TOLERANCE = 0.008  # about three standard errors


def false_pass_rates(*, n: int, margin: float, disagreement: float, seed: int,
                     bootstrap: bool = True) -> tuple[float, float | None]:
    """Share of seeded candidates truly worse by exactly `margin` (each task lost with probability (q + margin)/2,
    gained with (q − margin)/2) whose paired interval's low end clears −margin: the gate's false pass, (score,
    percentile bootstrap as the gate drew it). Each interval depends on the table's counts only, so it is computed
    once per table; the bootstrap's only when `bootstrap`."""
    rng = np.random.default_rng(seed)
    lost_p, gained_p = (disagreement + margin) / 2, (disagreement - margin) / 2
    tables = rng.multinomial(n, [gained_p, lost_p, 1.0 - gained_p - lost_p], size=DRAWS)[:, :2]
    rule = ChampionRule(margin=margin)
    score, boot = {}, {}
    for gained, lost in {tuple(t) for t in tables.tolist()}:
        score[gained, lost] = paired_score_interval(gained, lost, n)[0] >= -margin
        if not bootstrap:
            continue
        diff = np.zeros(n)
        diff[:gained], diff[gained:gained + lost] = 1.0, -1.0
        ci = paired_bootstrap(lambda idx, d=diff: float(d[idx].mean()), lambda idx: 0.0, n,
                              n_bootstrap=rule.n_bootstrap, seed=rule.seed, confidence=rule.confidence)["ci"]
        boot[gained, lost] = ci[0] >= -margin
    keys = [tuple(t) for t in tables.tolist()]
    return float(np.mean([score[k] for k in keys])), float(np.mean([boot[k] for k in keys])) if bootstrap else None


def test_the_score_interval_holds_its_one_sided_error_where_the_bootstrap_did_not():
    # issue 45: a candidate worse by the margin that only loses tasks (12 of 111 at margin 0.12); the bootstrap's
    # low end is too close to the point there, so it clears −margin more often than the nominal 2.5 %
    score, boot = false_pass_rates(n=111, margin=0.12, disagreement=0.12, seed=45)
    assert score <= 0.025 + TOLERANCE
    assert boot > 0.025 + TOLERANCE
    mixed, _ = false_pass_rates(n=231, margin=0.08, disagreement=0.2, seed=46, bootstrap=False)  # gains and losses
    assert mixed <= 0.025 + TOLERANCE


def rows(outcomes: list[bool], offset: int = 0) -> list[dict]:
    return [{"id": f"t{i}", "expected": "a", "option_ids": ["a", "b"],
             "probabilities": [0.9, 0.1] if right else [0.1, 0.9], "allowed_token_mass": 1.0,
             "latency_ms": 100.0 + i, "retries_503": 0, "error": None, "started_at": float(i + offset)}
            for i, right in enumerate(outcomes)]


def test_the_accuracy_difference_and_the_gate_report_use_and_name_the_score_interval():
    champion = [i % 4 != 0 for i in range(80)]
    candidate = [right and i >= 10 or (not right and i < 4) for i, right in enumerate(champion)]
    gained = sum(c and not h for c, h in zip(candidate, champion, strict=True))
    lost = sum(h and not c for c, h in zip(candidate, champion, strict=True))
    diff = paired_accuracy_difference(score_predictions(rows(candidate)), score_predictions(rows(champion)))
    assert (diff["gained"], diff["lost"], diff["n"]) == (gained, lost, 80)
    assert diff["difference"] == pytest.approx((gained - lost) / 80)
    assert diff["ci"] == paired_score_interval(gained, lost, 80) and diff["method"] == PAIRED_ACCURACY_METHOD
    report = evaluate_gates(rows(candidate), thresholds=None, champion_preds=rows(champion),
                            champion_rule=ChampionRule(margin=0.05, min_samples=30, also_ece_margin=0.1)).to_dict()
    check = next(c for c in report["checks"] if c["name"] == "champion_accuracy")
    assert check["ci"] == diff["ci"]
    methods = report["bootstrap"]["champion_methods"]
    assert methods["champion_accuracy"] == PAIRED_ACCURACY_METHOD
    assert methods["champion_ece"] == methods["champion_p95_ratio"] == "percentile bootstrap"
    assert report["bootstrap"]["method"] == "percentile"  # the candidate's own intervals
