"""The champion checks' power before a run: which margin a gate of n paired tasks can pass, and how often.

A champion check (`validation.gates._champion_check`) passes when the paired interval of candidate − champion clears
−margin on the bad side, fails when it lies wholly beyond it, else is inconclusive. With a per-task spread `sd` of the
paired difference, the estimate is about normal with standard error se = sd/√n and the interval is about
estimate ± z·se, so for a candidate truly worse by `shortfall` (≥ 0; 0 is an equally good one):

    P(pass) = Φ((margin − shortfall)/se − z)        P(fail) = Φ((shortfall − margin)/se − z)

and an equal candidate passes with probability `power` only when margin ≥ (z + z_power)·se. For accuracy the per-task
difference d ∈ {−1, 0, 1}; with disagreement rate q and true difference δ its variance is q − δ² (a candidate worse
by δ disagrees on at least |δ| of the tasks, so q is raised to |δ| where it is lower). Pure math: the CLI
(`shiplift gate plan`) reads the config and the ledger.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

from shiplift.validation.metrics import score_predictions
from shiplift.validation.thresholds import ChampionRule

POWER = 0.80  # the chance an equally good candidate should have of passing
PRIOR_DISAGREEMENT = 0.08  # a new model or quantization vs the champion (the seed's CPU and GPU builds: 2.6 %)
PRIOR_ECE_SD = 0.30  # per-task spread of the paired ECE difference when the ledger has none (a stated guess)
CANDIDATES = (("equal", 0.0), ("worse by the margin", 1.0), ("worse by twice the margin", 2.0))


def z_of(probability: float) -> float:
    """The standard normal quantile of `probability`."""
    return NormalDist().inv_cdf(probability)


def two_sided_z(confidence: float) -> float:
    """The z of a two-sided interval at `confidence` (1.96 at 0.95)."""
    return z_of(0.5 + confidence / 2.0)


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
    outcomes = []
    for label, times in CANDIDATES:
        shortfall = times * margin
        sd = accuracy_sd(spread.disagreement, shortfall) if spread.disagreement is not None else spread.sd
        odds = ({"pass": 0.0, "inconclusive": 1.0, "fail": 0.0} if n < rule.min_samples else
                outcome_probabilities(n=n, margin=margin, sd=sd, shortfall=shortfall, confidence=rule.confidence))
        outcomes.append({"candidate": label, "shortfall": shortfall, **odds})
    return CheckPlan(
        check=check, margin=margin, n=n, min_samples=rule.min_samples, confidence=rule.confidence, spread=spread,
        narrowest_margin=narrowest_margin(n=n, sd=spread.sd, confidence=rule.confidence),
        tasks_needed=tasks_needed(margin=margin, sd=spread.sd, confidence=rule.confidence),
        tasks_for_interval=tasks_needed(margin=margin, sd=spread.sd, confidence=rule.confidence, power=None),
        outcomes=outcomes)


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
