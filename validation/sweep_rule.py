"""A sweep's selection rule and its pick (issue 48): constraints and a lexicographic objective, written before any
candidate is measured, applied to every candidate's evidence to give the Pareto frontier and the pick.

Pure logic on recorded numbers (no I/O, no pipeline import): `shiplift sweep explain` re-derives the same pick from the
ledger alone by calling `choose` again on the rule and the evidence the ledger holds. docs/sweeps.md, "The rule and the
pick", says it for users.

- A constraint is an absolute bound (`at_most` / `at_least` on the measured value) or `not_worse_than_champion_by`,
  judged on the worse end of the paired interval of (candidate - champion), `intervals["<metric>_vs_champion"]`: its
  low end for a metric that is better higher (accuracy), its high end for one that is better lower (ECE, latency, $).
- Evidence that is missing never passes: a metric (or paired interval) a constraint, the objective or dominance needs
  and the candidate lacks is a violation that names what is missing.
- Dominance is judged on the DOMINANCE AXES: every objective metric in its direction, plus accuracy (higher is better)
  even where accuracy is only a constraint, so a cheaper model never hides a more accurate one off the frontier.
  A dominates B when A is at least as good on every axis and strictly better on one.
- The frontier is the candidates that meet every constraint and that no other such candidate dominates; the pick is the
  frontier's best by the objective read lexicographically (the first key decides, ties go to the next), and a tie at
  every key goes to the name that sorts first, which its verdict says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shiplift.tasks.errors import BadInput
from shiplift.tasks.hashing import sha256_json

Metric = Literal["accuracy", "ece", "valid_rate", "p50_ms", "p95_ms", "p99_ms", "usd_per_hour",
                 "usd_per_1m_decisions"]
Direction = Literal["min", "max"]
Status = Literal["picked", "frontier", "dominated", "violates"]


@dataclass(frozen=True)
class MetricInfo:
    """How a metric reads: which way is better, its unit, and the words a dominance reason uses for it."""

    better: Direction
    unit: str
    better_word: str  # "cheaper": B is <better_word> than A
    same_word: str  # "as cheap": B is <same_word> as A


METRICS: dict[str, MetricInfo] = {
    "accuracy": MetricInfo("max", "", "more accurate", "as accurate"),
    "ece": MetricInfo("min", "", "better calibrated", "as well calibrated"),
    "valid_rate": MetricInfo("max", "", "more often valid", "as often valid"),
    "p50_ms": MetricInfo("min", "ms", "faster at p50", "as fast at p50"),
    "p95_ms": MetricInfo("min", "ms", "faster at p95", "as fast at p95"),
    "p99_ms": MetricInfo("min", "ms", "faster at p99", "as fast at p99"),
    "usd_per_hour": MetricInfo("min", "$/h", "cheaper per hour", "as cheap per hour"),
    "usd_per_1m_decisions": MetricInfo("min", "$/1M decisions", "cheaper per decision", "as cheap per decision"),
}
ALWAYS_AXIS = "accuracy"  # a dominance axis even where the rule only constrains it
VS_CHAMPION = "_vs_champion"  # intervals["<metric>_vs_champion"]: paired (candidate - champion) interval


def champion_interval_key(metric: str) -> str:
    """The `intervals` key of a metric's paired (candidate - champion) interval."""
    return f"{metric}{VS_CHAMPION}"


def fmt(value: float | None) -> str:
    """A measured number as a reason prints it: 1,240 for large values, 4 significant digits otherwise."""
    if value is None:
        return "not measured"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


class Constraint(BaseModel):
    """One condition every eligible candidate meets: exactly one of an absolute bound (`at_most`, `at_least`) or
    `not_worse_than_champion_by` (a margin on the worse end of the paired interval against the champion)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    metric: Metric
    at_most: float | None = Field(default=None, allow_inf_nan=False)
    at_least: float | None = Field(default=None, allow_inf_nan=False)
    not_worse_than_champion_by: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [name for name in ("at_most", "at_least", "not_worse_than_champion_by")
                 if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"constraint on {self.metric} sets {', '.join(given) or 'no bound'}; set exactly one of "
                             "at_most, at_least or not_worse_than_champion_by (write two constraints for a range)")
        return self

    def text(self) -> str:
        """The constraint as a reason quotes it: `p95_ms <= 800`, `accuracy not worse than the champion by 0.02`."""
        if self.at_most is not None:
            return f"{self.metric} <= {fmt(self.at_most)}"
        if self.at_least is not None:
            return f"{self.metric} >= {fmt(self.at_least)}"
        return f"{self.metric} not worse than the champion by {fmt(self.not_worse_than_champion_by)}"

    def violation(self, evidence: CandidateEvidence) -> str | None:
        """Why `evidence` breaks this constraint, or None when it meets it (missing evidence breaks it)."""
        if self.not_worse_than_champion_by is not None:
            return self._champion_violation(evidence)
        value = evidence.metrics.get(self.metric)
        if value is None:
            return f"violates {self.text()} (not measured)"
        ok = value <= self.at_most if self.at_most is not None else value >= self.at_least
        return None if ok else f"violates {self.text()} (measured {fmt(value)})"

    def _champion_violation(self, evidence: CandidateEvidence) -> str | None:
        interval = evidence.intervals.get(champion_interval_key(self.metric))
        if interval is None:
            return (f"violates {self.text()} (no paired interval against the champion, "
                    f"{champion_interval_key(self.metric)}, was recorded)")
        low, high = interval
        margin = self.not_worse_than_champion_by
        if METRICS[self.metric].better == "max":
            worse_end, ok = low, low >= -margin
        else:
            worse_end, ok = high, high <= margin
        if ok:
            return None
        return (f"violates {self.text()} (paired interval [{fmt(low)}, {fmt(high)}], worse end {fmt(worse_end)})")


class Objective(BaseModel):
    """One key of the lexicographic objective: a metric and the way that is better for it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    metric: Metric
    direction: Direction

    @model_validator(mode="after")
    def _sensible_direction(self):
        better = METRICS[self.metric].better
        if self.direction != better:
            raise ValueError(f"objective {self.direction} {self.metric}: {self.metric} is better "
                             f"{'higher' if better == 'max' else 'lower'}; write direction: {better}")
        return self


class SelectionRule(BaseModel):
    """A sweep's rule, fixed before any candidate is measured: every constraint must hold, then the objective picks
    from the frontier (first key decides, ties go to the next)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    constraints: list[Constraint]
    objective: list[Objective] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct_keys(self):
        metrics = [key.metric for key in self.objective]
        repeated = sorted({m for m in metrics if metrics.count(m) > 1})
        if repeated:
            raise ValueError(f"objective names {', '.join(repeated)} more than once; a repeated key never decides "
                             "anything, so list each metric once")
        return self

    def canonical(self) -> dict[str, Any]:
        """The rule as hashed: its fields, unset bounds left out (so a field added later with a None default keeps
        the hashes of the rules written before it)."""
        return self.model_dump(mode="json", exclude_none=True)

    def sha256(self) -> str:
        """sha256 of the canonical JSON of the rule: any field changes it, key order in the YAML does not (the list
        order of constraints and objective keys is part of the rule as written)."""
        return sha256_json(self.canonical())

    def axes(self) -> list[tuple[str, Direction]]:
        """The dominance axes: every objective metric in its direction, then accuracy if the objective lacks it."""
        axes = [(key.metric, key.direction) for key in self.objective]
        if ALWAYS_AXIS not in {metric for metric, _ in axes}:
            axes.append((ALWAYS_AXIS, METRICS[ALWAYS_AXIS].better))
        return axes


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadInput(f"{what} is {value!r}, not a finite number", fix="record measured numbers (None: not measured)")
    return float(value)


@dataclass(frozen=True)
class CandidateEvidence:
    """What one candidate measured: its metrics (None: not measured) and its intervals (e.g. `accuracy_vs_champion`,
    the paired 95 % interval of candidate - champion; `accuracy`, the candidate's own bootstrap interval)."""

    name: str
    config_sha256: str
    metrics: dict[str, float | None]
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise BadInput(f"candidate name {self.name!r} is empty or not text", fix="name every candidate")
        unknown = sorted(set(self.metrics) - set(METRICS))
        if unknown:
            raise BadInput(f"candidate {self.name}: unknown metric(s) {', '.join(unknown)}",
                           fix=f"record only {', '.join(METRICS)}")
        for metric, value in self.metrics.items():
            if value is not None:
                _number(value, f"candidate {self.name}: {metric}")
        for key, interval in self.intervals.items():
            if len(interval) != 2:
                raise BadInput(f"candidate {self.name}: interval {key} is {interval!r}, not [low, high]",
                               fix="record each interval as two numbers")
            low, high = (_number(v, f"candidate {self.name}: interval {key}") for v in interval)
            if low > high:
                raise BadInput(f"candidate {self.name}: interval {key} is [{low}, {high}], low above high",
                               fix="record an interval as [low, high]")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (a ledger record's payload); `from_json` reads it back."""
        return {"name": self.name, "config_sha256": self.config_sha256, "metrics": dict(sorted(self.metrics.items())),
                "intervals": {key: [low, high] for key, (low, high) in sorted(self.intervals.items())}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CandidateEvidence:
        """Read `to_json`'s dict back, refusing a malformed one with a message that names the field."""
        if not isinstance(data, Mapping):
            raise BadInput(f"candidate evidence is {type(data).__name__}, not an object", fix="pass to_json()'s dict")
        extra = sorted(set(data) - {"name", "config_sha256", "metrics", "intervals"})
        missing = sorted({"name", "config_sha256", "metrics"} - set(data))
        if extra or missing:
            raise BadInput(f"candidate evidence: missing {missing or 'nothing'}, unknown {extra or 'nothing'}",
                           fix="pass to_json()'s dict")
        metrics, intervals = data["metrics"], data.get("intervals", {})
        if not isinstance(metrics, Mapping) or not isinstance(intervals, Mapping):
            raise BadInput(f"candidate {data['name']!r}: metrics and intervals must be objects",
                           fix="pass to_json()'s dict")
        for key, interval in intervals.items():
            if not isinstance(interval, list | tuple):
                raise BadInput(f"candidate {data['name']!r}: interval {key} is {interval!r}, not [low, high]",
                               fix="record each interval as two numbers")
        return cls(name=data["name"], config_sha256=data["config_sha256"], metrics=dict(metrics),
                   intervals={key: tuple(interval) for key, interval in intervals.items()})


@dataclass(frozen=True)
class Verdict:
    """What the rule made of one candidate, and why in one line."""

    name: str
    status: Status
    reason: str

    def to_json(self) -> dict[str, str]:
        """A JSON-ready dict (part of the ledger's `picked` record)."""
        return {"name": self.name, "status": self.status, "reason": self.reason}


@dataclass(frozen=True)
class Pick:
    """The rule's answer: the pick (None when no candidate meets the rule), the frontier best first, and a verdict
    per candidate in name order."""

    rule_sha256: str
    picked: str | None
    frontier: list[str]
    verdicts: list[Verdict]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the ledger's `picked` record, sweep-report.json's `pick`)."""
        return {"rule_sha256": self.rule_sha256, "picked": self.picked, "frontier": list(self.frontier),
                "verdicts": [verdict.to_json() for verdict in self.verdicts]}


def _violations(rule: SelectionRule, evidence: CandidateEvidence) -> list[str]:
    """Every reason `evidence` is not eligible: broken constraints, then metrics the objective or dominance needs."""
    reasons = [reason for constraint in rule.constraints if (reason := constraint.violation(evidence))]
    for metric, _ in rule.axes():
        if evidence.metrics.get(metric) is None:
            need = "the objective" if any(key.metric == metric for key in rule.objective) else "dominance"
            reasons.append(f"{metric} not measured, which {need} needs")
    return reasons


def _better(a: float, b: float, direction: Direction) -> bool:
    """a is strictly better than b in `direction`."""
    return a > b if direction == "max" else a < b


def dominates(axes: Sequence[tuple[str, Direction]], a: CandidateEvidence, b: CandidateEvidence) -> bool:
    """a is at least as good as b on every axis and strictly better on one (both measured on every axis)."""
    strictly = False
    for metric, direction in axes:
        va, vb = a.metrics[metric], b.metrics[metric]
        if _better(vb, va, direction):
            return False
        strictly = strictly or _better(va, vb, direction)
    return strictly


def _rank_key(rule: SelectionRule, evidence: CandidateEvidence) -> tuple:
    """Sort key: the objective read lexicographically (better first), then the name."""
    keys = [-evidence.metrics[k.metric] if k.direction == "max" else evidence.metrics[k.metric] for k in rule.objective]
    return (*keys, evidence.name)


def _dominance_reason(axes: Sequence[tuple[str, Direction]], winner: CandidateEvidence,
                      loser: CandidateEvidence) -> str:
    words = [METRICS[m].better_word if _better(winner.metrics[m], loser.metrics[m], d) else METRICS[m].same_word
             for m, d in axes]
    return f"dominated by {winner.name} ({', '.join(words)})"


def _lost_reason(rule: SelectionRule, winner: CandidateEvidence, loser: CandidateEvidence) -> str:
    """Why a frontier member is not the pick: the first objective key on which the pick is better."""
    for key in rule.objective:
        w, lo = winner.metrics[key.metric], loser.metrics[key.metric]
        if w != lo:
            return (f"on the frontier; {winner.name} is better on {key.direction} {key.metric} "
                    f"({fmt(w)} vs {fmt(lo)})")
    return f"on the frontier; ties {winner.name} on every objective key, and {winner.name} sorts first by name"


def _picked_reason(rule: SelectionRule, pick: CandidateEvidence, frontier: Sequence[CandidateEvidence]) -> str:
    keys = ", then ".join(f"{key.direction} {key.metric} {fmt(pick.metrics[key.metric])}" for key in rule.objective)
    tied = [c.name for c in frontier[1:] if _rank_key(rule, c)[:-1] == _rank_key(rule, pick)[:-1]]
    tie = f"; ties {', '.join(tied)} on every objective key and sorts first by name" if tied else ""
    return f"best on the frontier by the objective ({keys}){tie}"


def choose(rule: SelectionRule, candidates: Sequence[CandidateEvidence]) -> Pick:
    """Apply the rule: the eligible candidates, their Pareto frontier on the dominance axes, and the frontier's best by
    the lexicographic objective. Deterministic, and independent of the order the candidates come in."""
    names = [c.name for c in candidates]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise BadInput(f"candidate name(s) {', '.join(repeated)} appear more than once",
                       fix="give every candidate of a sweep its own name")
    axes = rule.axes()
    verdicts: dict[str, Verdict] = {}
    eligible = []
    for evidence in candidates:
        reasons = _violations(rule, evidence)
        if reasons:
            verdicts[evidence.name] = Verdict(evidence.name, "violates", "; ".join(reasons))
        else:
            eligible.append(evidence)
    eligible.sort(key=lambda c: _rank_key(rule, c))
    frontier = [c for c in eligible if not any(dominates(axes, other, c) for other in eligible)]
    on_frontier = {c.name for c in frontier}
    for evidence in eligible:
        if evidence.name in on_frontier:
            continue
        # a dominated candidate is dominated by some frontier member too (dominance is transitive); name the best one
        winner = next(f for f in frontier if dominates(axes, f, evidence))
        verdicts[evidence.name] = Verdict(evidence.name, "dominated", _dominance_reason(axes, winner, evidence))
    if frontier:
        best = frontier[0]
        verdicts[best.name] = Verdict(best.name, "picked", _picked_reason(rule, best, frontier))
        for member in frontier[1:]:
            verdicts[member.name] = Verdict(member.name, "frontier", _lost_reason(rule, best, member))
    return Pick(rule_sha256=rule.sha256(), picked=frontier[0].name if frontier else None,
                frontier=[c.name for c in frontier], verdicts=[verdicts[name] for name in sorted(verdicts)])

