"""Validation gates (DESIGN §8.3): absolute thresholds and "not worse than the champion".

Every check returns its evidence (observed value, threshold, comparator, interval, sample
size) and a status: pass, fail, inconclusive or skipped. The decision is "fail" when any
check fails, else "inconclusive" when any is inconclusive, else "pass"; only "pass" promotes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from tasks.errors import BadInput, GateFailed
from validation.thresholds import ChampionRule, DecisionThresholds
from validation.metrics import (
    decision_metrics,
    paired_accuracy_difference,
    paired_ece_difference,
    score_predictions,
)

Status = Literal["pass", "fail", "inconclusive", "skipped"]


class Check(BaseModel):
    """One gate check with its evidence."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    status: Status
    observed: float | None
    threshold: float | None
    comparator: str
    ci: list[float] | None
    n: int
    reason: str

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @model_validator(mode="after")
    def _finite(self) -> Check:
        for value in (self.observed, self.threshold, *(self.ci or [])):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"check {self.name}: non-finite evidence {value!r}")
        return self


class GateReport(BaseModel):
    """The decision, every check, the metrics and the exact thresholds used."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: Literal["pass", "fail", "inconclusive"]
    checks: list[Check]
    metrics: dict[str, Any]
    thresholds: DecisionThresholds
    champion_rule: ChampionRule | None
    sample_sizes: dict[str, int]
    champion: dict[str, Any]
    bootstrap: dict[str, Any]

    def to_dict(self) -> dict:
        """JSON-able form for gate-report.json and the ledger (checks carry `passed` too)."""
        data = self.model_dump(mode="json")
        for check, model in zip(data["checks"], self.checks, strict=True):
            check["passed"] = model.passed
        return data

    def require_pass(self) -> None:
        """Raise GateFailed unless the decision is pass (inconclusive never promotes)."""
        if self.decision == "pass":
            return
        blocking = [f"{c.name}: {c.status} ({c.reason})" for c in self.checks if c.status in ("fail", "inconclusive")]
        raise GateFailed(
            f"gate decision is {self.decision}: " + "; ".join(blocking),
            fix="inspect gate-report.json; fix the candidate, or change the release config's thresholds if justified",
        )


def _absolute(name: str, observed: dict | None, threshold: float | None, comparator: str) -> Check | None:
    if threshold is None:
        return None
    value = observed.get("value") if observed else None
    n = int(observed.get("n", 0)) if observed else 0
    ci = observed.get("ci") if observed else None
    if value is None:
        return Check(
            name=name, status="fail", observed=None, threshold=threshold, comparator=comparator, ci=None, n=n,
            reason="no rows to measure it on (every request failed or the value was not reported)",
        )
    ok = value >= threshold if comparator == ">=" else value <= threshold
    return Check(
        name=name, status="pass" if ok else "fail", observed=value, threshold=threshold, comparator=comparator,
        ci=ci, n=n, reason=f"observed {value:.6g} {comparator} {threshold:.6g} is {'true' if ok else 'false'}",
    )


def _champion_check(name: str, diff: dict, *, margin: float, min_samples: int, higher_is_better: bool) -> Check:
    n = int(diff["n"])
    threshold = -margin if higher_is_better else margin
    # pass when the whole paired interval clears the margin, fail when it lies wholly beyond it
    comparator = "paired ci_low >= threshold" if higher_is_better else "paired ci_high <= threshold"
    if n < min_samples:
        return Check(
            name=name, status="inconclusive", observed=diff["difference"], threshold=threshold,
            comparator=comparator, ci=diff["ci"], n=n,
            reason=f"only {n} shared tasks, fewer than min_samples={min_samples}: the gate refuses to decide",
        )
    low, high = diff["ci"]
    if higher_is_better:
        status = "pass" if low >= -margin else "fail" if high < -margin else "inconclusive"
    else:
        status = "pass" if high <= margin else "fail" if low > margin else "inconclusive"
    return Check(
        name=name, status=status, observed=diff["difference"], threshold=threshold, comparator=comparator,
        ci=diff["ci"], n=n,
        reason=f"candidate - champion = {diff['difference']:.4f}, CI [{low:.4f}, {high:.4f}], margin {margin:g}",
    )


def evaluate_gates(
    candidate_preds: Sequence[Mapping[str, Any]],
    *,
    thresholds: DecisionThresholds,
    champion_preds: Sequence[Mapping[str, Any]] | None = None,
    champion_rule: ChampionRule | None = None,
    candidate_metrics: dict | None = None,
    n_bootstrap: int | None = None,
    seed: int | None = None,
) -> GateReport:
    """Judge a candidate's predictions against absolute thresholds and, if given, the champion's.

    `n_bootstrap` / `seed`, when given (the release's `validation.n_bootstrap` / `seed`), set the candidate's own
    intervals; the paired champion comparison always uses the champion rule's own `n_bootstrap` / `seed`. The values
    used are recorded in the report's `bootstrap` (`champion_comparison` for the rule's)."""
    if champion_preds is not None and champion_rule is None:
        raise BadInput(
            "champion predictions were given without a champion rule",
            fix="pass champion_rule=ChampionRule(...) from the release config's gate settings",
        )
    bad_count = isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int) or n_bootstrap < 100
    if n_bootstrap is not None and bad_count:
        raise BadInput(f"n_bootstrap must be an integer >= 100, got {n_bootstrap!r}", fix="use e.g. 1000")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise BadInput(f"seed must be a non-negative integer, got {seed!r}", fix="use e.g. 0")
    rule = champion_rule or ChampionRule()
    boot = {
        "n_bootstrap": rule.n_bootstrap if n_bootstrap is None else n_bootstrap,
        "seed": rule.seed if seed is None else seed,
        "confidence": rule.confidence,
    }
    paired = {"n_bootstrap": rule.n_bootstrap, "seed": rule.seed, "confidence": rule.confidence}
    metrics = candidate_metrics
    if metrics is None:
        metrics = decision_metrics(candidate_preds, **boot)
    if metrics.get("n") != len(candidate_preds):
        raise BadInput(
            f"candidate_metrics were computed on {metrics.get('n')} rows "
            f"but {len(candidate_preds)} predictions were given",
            fix="pass the metrics of these same predictions, or leave candidate_metrics out",
        )
    latency = metrics["latency_ms"]
    checks = [
        _absolute("accuracy", metrics["accuracy"], thresholds.min_accuracy, ">="),
        _absolute("ece", metrics["ece"], thresholds.max_ece, "<="),
        _absolute("validity", metrics["validity"], thresholds.min_validity, ">="),
        _absolute("p95_latency_ms", latency["p95"], thresholds.max_p95_latency_ms, "<="),
        _absolute("allowed_token_mass", metrics["allowed_token_mass"], thresholds.min_allowed_token_mass, ">="),
    ]
    champion: dict[str, Any] = {"present": champion_preds is not None}
    sample_sizes = {"candidate": metrics["n"], "candidate_valid": metrics["n_valid"]}
    if champion_preds is None:
        checks.append(
            Check(
                name="champion_accuracy", status="skipped", observed=None, threshold=None, comparator="",
                ci=None, n=0, reason="skipped: no champion",
            )
        )
    else:
        candidate = score_predictions(candidate_preds)
        incumbent = score_predictions(champion_preds)
        accuracy_diff = paired_accuracy_difference(candidate, incumbent, **paired)
        checks.append(
            _champion_check(
                "champion_accuracy", accuracy_diff, margin=rule.margin, min_samples=rule.min_samples,
                higher_is_better=True,
            )
        )
        champion.update(
            n=incumbent.n, n_valid=int(incumbent.valid.sum()), retries_503=incumbent.retries_503,
            errors=incumbent.errors, accuracy=accuracy_diff,
        )
        sample_sizes.update(champion=incumbent.n, shared=accuracy_diff["n"])
        if rule.also_ece_margin is not None:
            ece_diff = paired_ece_difference(candidate, incumbent, **paired)
            checks.append(
                _champion_check(
                    "champion_ece", ece_diff, margin=rule.also_ece_margin, min_samples=rule.min_samples,
                    higher_is_better=False,
                )
            )
            champion["ece"] = ece_diff
            sample_sizes["shared_valid_both"] = ece_diff["n"]
    kept = [check for check in checks if check is not None]
    statuses = {check.status for check in kept}
    decision = "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"
    return GateReport(
        decision=decision,
        checks=kept,
        metrics=metrics,
        thresholds=thresholds,
        champion_rule=champion_rule,
        sample_sizes=sample_sizes,
        champion=champion,
        bootstrap={**boot, "method": "percentile", "candidate_metrics": metrics.get("bootstrap"),
                   "champion_comparison": paired if champion_preds is not None else None},
    )
