"""The champion checks' power before a run: which margin a gate of n paired tasks can pass, and how often.

A champion check (`validation.gates._champion_check`) passes when the paired interval of candidate − champion clears
−margin on the bad side, fails when it lies wholly beyond it, else is inconclusive. With a per-task spread `sd` of the
paired difference, the estimate is about normal with standard error se = sd/√n and the interval is about
estimate ± z·se, so for a candidate truly worse by `shortfall` (≥ 0; 0 is an equally good one):

    P(pass) = Φ((margin − shortfall)/se − z)        P(fail) = Φ((shortfall − margin)/se − z)

and an equal candidate passes with probability `power` only when margin ≥ (z + z_power)·se: the ECE check's model.
The accuracy check's interval is Tango's score interval (`validation.metrics.paired_score_interval`), computed exactly
instead: a candidate that disagrees with the champion on a share q of tasks and is worse by δ (q raised to δ where it
is lower) gains a task with probability (q − δ)/2 and loses one with (q + δ)/2, and the check passes on a table
(gained, lost) exactly when the score statistic at −margin is ≥ z (the interval's low end clears −margin; the
statistic decreases in the difference), fails when it is ≤ −z; `score_outcomes` sums the tables' multinomial
probabilities. Per-task SD (`accuracy_sd`, √(q − δ²)) still describes the spread. Pure math: the CLI
(`shiplift gate plan`) reads the config and the ledger.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

from shiplift.validation.metrics import score_predictions, tango_statistic, two_sided_z
from shiplift.validation.thresholds import ChampionRule

POWER = 0.80  # the chance an equally good candidate should have of passing
PRIOR_DISAGREEMENT = 0.08  # a new model or quantization vs the champion (the seed's CPU and GPU builds: 2.6 %)
PRIOR_ECE_SD = 0.30  # per-task spread of the paired ECE difference when the ledger has none (a stated guess)
CANDIDATES = (("equal", 0.0), ("worse by the margin", 1.0), ("worse by twice the margin", 2.0))


def z_of(probability: float) -> float:
    """The standard normal quantile of `probability`."""
    return NormalDist().inv_cdf(probability)


def accuracy_sd(disagreement: float, shortfall: float = 0.0) -> float:
    """Per-task SD of a paired accuracy difference: √(q − δ²), with q at least |δ| (worse by δ means ≥ |δ| differ) and
    δ at most 1 (no candidate is worse than wrong on every task the champion gets right)."""
    shortfall = min(shortfall, 1.0)
    return math.sqrt(max(disagreement, shortfall) - shortfall**2)


def outcome_probabilities(*, n: int, margin: float, sd: float, shortfall: float, confidence: float) -> dict[str, float]:
    """P(pass), P(inconclusive), P(fail) of a champion check on `n` paired tasks for a candidate truly worse by
    `shortfall` (normal approximation of the paired interval; see the module's docstring)."""
    z = two_sided_z(confidence)
    se = sd / math.sqrt(n)
    if se == 0.0:  # no spread: the interval is the point, the outcome certain
        passed = shortfall <= margin
        return {"pass": float(passed), "inconclusive": 0.0, "fail": float(not passed)}
    normal = NormalDist()
    passed = normal.cdf((margin - shortfall) / se - z)
    failed = normal.cdf((shortfall - margin) / se - z)
    return {"pass": passed, "inconclusive": max(0.0, 1.0 - passed - failed), "fail": failed}


def binomial_pmf(successes: np.ndarray, trials: np.ndarray, p: float, log_factorial: np.ndarray) -> np.ndarray:
    """P(X = successes) for X ~ Binomial(trials, p), elementwise (0 outside 0..trials), from a table of log k! (numpy
    alone: scipy would be imported, seconds on a busy machine, for every gate with a champion)."""
    successes, trials = np.broadcast_arrays(np.asarray(successes), np.asarray(trials))
    inside = (successes >= 0) & (successes <= trials)
    k, m = np.where(inside, successes, 0), np.where(inside, trials, 0)
    with np.errstate(divide="ignore", invalid="ignore"):  # log 0 where p is 0 or 1: those terms count only when used
        hits = np.where(k > 0, k * np.log(p), 0.0)
        misses = np.where(m - k > 0, (m - k) * np.log1p(-p), 0.0)
    log_pmf = log_factorial[m] - log_factorial[k] - log_factorial[m - k] + hits + misses
    return np.where(inside, np.exp(log_pmf), 0.0)


def score_outcomes(*, n: int, margin: float, disagreement: float, shortfall: float,
                   confidence: float) -> dict[str, float]:
    """P(pass), P(inconclusive), P(fail) of the accuracy check on `n` paired tasks, exactly, for a candidate worse by
    `shortfall` that answers differently from the champion on a share `disagreement` of tasks (see the module's
    docstring). The tables summed are those whose discordant count has probability above 1e-15."""
    shortfall = min(max(shortfall, 0.0), 1.0)
    q = min(max(disagreement, shortfall), 1.0)
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])
    discordant = np.arange(n + 1)
    weight = binomial_pmf(discordant, n, q, log_factorial)
    discordant, weight = discordant[weight > 1e-15], weight[weight > 1e-15]
    lost_share = (q + shortfall) / (2.0 * q) if q > 0 else 0.0
    lost = np.arange(discordant.max() + 1)[None, :]
    probability = weight[:, None] * binomial_pmf(lost, discordant[:, None], lost_share, log_factorial)
    statistic = tango_statistic(np.maximum(discordant[:, None] - lost, 0), lost, n, -margin)
    z = two_sided_z(confidence)
    passed, failed = float(probability[statistic >= z].sum()), float(probability[statistic <= -z].sum())
    return {"pass": passed, "inconclusive": max(0.0, 1.0 - passed - failed), "fail": failed}


def _least(enough: Callable[[float], bool], low: float, high: float, *, steps: int = 40) -> float:
    """The least x in [low, high] with `enough(x)`, by bisection (`enough` false at `low`, true at `high`, and
    monotone between)."""
    for _ in range(steps):
        middle = (low + high) / 2.0
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def score_narrowest_margin(*, n: int, disagreement: float, confidence: float, power: float = POWER) -> float:
    """The smallest accuracy margin an equally good candidate passes with probability `power` (`score_outcomes`;
    its pass probability grows with the margin)."""
    return _least(lambda margin: score_outcomes(n=n, margin=margin, disagreement=disagreement, shortfall=0.0,
                                                confidence=confidence)["pass"] >= power, 0.0, 1.0)


def score_tasks_needed(*, margin: float, disagreement: float, confidence: float,
                       power: float | None = POWER) -> int | None:
    """About the fewest paired tasks for an equally good candidate to pass the accuracy check at `margin` with
    probability `power` (None: ½, the interval's low end about at −margin), by bisection on n (the exact probability
    steps with the discrete tables, so a neighbouring n can differ by a little); None at margin 0, which no number of
    tasks passes, or past a million tasks."""
    if margin <= 0:
        return None
    target = 0.5 if power is None else power

    def enough(n: float) -> bool:
        return score_outcomes(n=math.ceil(n), margin=margin, disagreement=disagreement, shortfall=0.0,
                              confidence=confidence)["pass"] >= target

    high = 1
    while not enough(high):
        if high >= 1_000_000:
            return None
        high *= 2
    return math.ceil(_least(enough, high / 2, high, steps=max(1, math.ceil(math.log2(high)) + 1)))


def narrowest_margin(*, n: int, sd: float, confidence: float, power: float = POWER) -> float:
    """The smallest margin an equally good candidate passes with probability `power`: (z + z_power)·sd/√n."""
    return (two_sided_z(confidence) + z_of(power)) * sd / math.sqrt(n)


def tasks_needed(*, margin: float, sd: float, confidence: float, power: float | None = POWER) -> int | None:
    """Paired tasks for an equal candidate to pass at `margin` with probability `power`; `power` None: for the
    interval's half-width alone to fit inside the margin (z²·sd²/margin², a coin flip's chance of passing); None
    at margin 0, which no number of tasks passes with any spread."""
    z = two_sided_z(confidence) + (z_of(power) if power is not None else 0.0)
    return math.ceil((z * sd / margin) ** 2) if margin > 0 else None


def sd_from_interval(ci: list[float], n: int, confidence: float) -> float:
    """The per-task SD a paired interval on `n` tasks implies: √n·(high − low)/(2z)."""
    return math.sqrt(n) * (ci[1] - ci[0]) / (2.0 * two_sided_z(confidence))


@dataclass(frozen=True)
class Spread:
    """Per-task spread of one check's paired difference for an equal candidate, and where it came from."""

    sd: float
    source: str  # "prior" or "ledger: K comparisons, N tasks"
    disagreement: float | None = None  # accuracy only: the share of tasks the two models answer differently


def paired_disagreement(candidate_rows: Sequence[Mapping], champion_rows: Sequence[Mapping]) -> tuple[int, int]:
    """(shared tasks, tasks one model got right and the other wrong) of a recorded comparison's prediction rows."""
    candidate, champion = score_predictions(candidate_rows), score_predictions(champion_rows)
    champion_correct = dict(zip(champion.ids, champion.correct, strict=True))
    shared = [(right, champion_correct[ident]) for ident, right in zip(candidate.ids, candidate.correct, strict=True)
              if ident in champion_correct]
    return len(shared), sum(bool(a) != bool(b) for a, b in shared)


def counted_spread(disagreements: Iterable[tuple[int, int]]) -> Spread | None:
    """The accuracy spread counted on recorded per-task outcomes ((shared, disagreeing) per comparison), pooled;
    None when there are none."""
    counts = [(shared, differ) for shared, differ in disagreements if shared]
    if not counts:
        return None
    total = sum(shared for shared, _ in counts)
    q = sum(differ for _, differ in counts) / total
    return Spread(sd=accuracy_sd(q), disagreement=q,
                  source=f"ledger: {len(counts)} comparison(s)' per-task outcomes, {total} tasks")


def measured_spread(check: str, recorded: Iterable[Mapping], confidence: float) -> Spread | None:
    """The spread of `check` pooled (weighted by tasks) over the recorded champion comparisons of that check, from
    each one's paired interval (`sd_from_interval`; accuracy: q = sd² + difference²); None when there are none."""
    rows = [c for c in recorded if c.get("name") == check and c.get("rule") == "paired" and c.get("ci")
            and c.get("n") and c.get("observed") is not None and c.get("status") != "skipped"]
    if not rows:
        return None
    total = sum(int(c["n"]) for c in rows)
    variance = sum(int(c["n"]) * sd_from_interval(c["ci"], int(c["n"]), confidence) ** 2 for c in rows) / total
    source = f"ledger: {len(rows)} comparison(s), {total} tasks"
    if check == "champion_accuracy":
        q = variance + sum(int(c["n"]) * c["observed"] ** 2 for c in rows) / total
        return Spread(sd=math.sqrt(q), source=source, disagreement=q)
    return Spread(sd=math.sqrt(variance), source=source)


def prior_spread(check: str) -> Spread:
    """The stated prior of a check with no recorded comparison."""
    if check == "champion_accuracy":
        return Spread(sd=accuracy_sd(PRIOR_DISAGREEMENT), source="prior", disagreement=PRIOR_DISAGREEMENT)
    return Spread(sd=PRIOR_ECE_SD, source="prior")


@dataclass(frozen=True)
class CheckPlan:
    """One champion check's power: its margin and tasks, the spread used, the narrowest margin it passes at `POWER`
    for an equal candidate, the tasks its margin needs, and each candidate's outcome probabilities."""

    check: str
    margin: float
    n: int
    min_samples: int
    confidence: float
    spread: Spread
    narrowest_margin: float
    tasks_needed: int | None
    tasks_for_interval: int | None
    outcomes: list[dict]

    @property
    def equal_passes(self) -> float:
        return self.outcomes[0]["pass"]

    @property
    def underpowered(self) -> bool:
        return self.equal_passes < POWER

    def as_dict(self) -> dict:
        return {**asdict(self), "power": POWER, "equal_passes": self.equal_passes, "underpowered": self.underpowered}

    def warning(self, where: str) -> str:
        """What to tell a release manager about an underpowered check: the numbers and the fix."""
        spread = (f"{self.spread.disagreement:.0%} disagreement" if self.spread.disagreement is not None
                  else f"per-task SD {self.spread.sd:.2f}") + f" ({self.spread.source})"
        if self.n < self.min_samples:
            return (f"{self.check}: {self.n} tasks are fewer than min_samples={self.min_samples}, so the check is "
                    f"always inconclusive; add tasks to the test split of {where} or lower min_samples")
        return (f"{self.check}: an equally good candidate passes with probability {self.equal_passes:.2f} at margin "
                f"{self.margin:g} on {self.n} tasks at {spread}; {POWER:.0%} power needs a margin of at least "
                f"{self.narrowest_margin:.3f} or {self.tasks_needed} tasks: widen validation.champion's margin or add "
                f"tasks to {where}")


def plan_check(check: str, *, margin: float, n: int, rule: ChampionRule, spread: Spread) -> CheckPlan:
    """The power of one champion check of `rule` on `n` paired tasks (always inconclusive below min_samples)."""
    q, confidence = spread.disagreement, rule.confidence  # q: accuracy, judged on Tango's score interval
    outcomes = []
    for label, times in CANDIDATES:
        shortfall = times * margin
        odds = ({"pass": 0.0, "inconclusive": 1.0, "fail": 0.0} if n < rule.min_samples else
                outcome_probabilities(n=n, margin=margin, sd=spread.sd, shortfall=shortfall, confidence=confidence)
                if q is None else
                score_outcomes(n=n, margin=margin, disagreement=q, shortfall=shortfall, confidence=confidence))
        outcomes.append({"candidate": label, "shortfall": shortfall, **odds})
    if q is None:
        narrowest = narrowest_margin(n=n, sd=spread.sd, confidence=confidence)
        needed, for_interval = (tasks_needed(margin=margin, sd=spread.sd, confidence=confidence, power=power)
                                for power in (POWER, None))
    else:
        narrowest = score_narrowest_margin(n=n, disagreement=q, confidence=confidence)
        needed, for_interval = (score_tasks_needed(margin=margin, disagreement=q, confidence=confidence, power=power)
                                for power in (POWER, None))
    return CheckPlan(
        check=check, margin=margin, n=n, min_samples=rule.min_samples, confidence=confidence, spread=spread,
        narrowest_margin=narrowest, tasks_needed=needed, tasks_for_interval=for_interval, outcomes=outcomes)


def plan_champion_checks(rule: ChampionRule, n: int, recorded: Iterable[Mapping] = (),
                         disagreements: Iterable[tuple[int, int]] = ()) -> list[CheckPlan]:
    """Every champion check `rule` makes (accuracy; ECE when `also_ece_margin` is set), each with the spread measured
    between the champion and earlier challengers: accuracy's counted on their per-task outcomes (`disagreements`)
    where there are any, else read from their recorded paired intervals (`recorded` checks); else the stated prior."""
    recorded = list(recorded)
    counted = counted_spread(disagreements)
    checks = [("champion_accuracy", rule.margin, counted)]
    if rule.also_ece_margin is not None:
        checks.append(("champion_ece", rule.also_ece_margin, None))
    return [plan_check(name, margin=margin, n=n, rule=rule,
                       spread=spread or measured_spread(name, recorded, rule.confidence) or prior_spread(name))
            for name, margin, spread in checks]
