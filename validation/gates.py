"""Validation gates (DESIGN §8.3): absolute thresholds and "not worse than the champion".

Every check returns its evidence (observed value, threshold, comparator, interval, sample
size), the rule it used (`bound`: the interval's conservative end, the default; `point`: the
point estimate; `paired`: the champion comparison's paired interval) and a status: pass, fail,
inconclusive or skipped. The decision is "fail" when any check fails, else "inconclusive" when
any is inconclusive, else "pass"; only "pass" promotes. A run with no thresholds and no champion
is `not_gated`: it measures, it does not judge.

The report also sets the candidate beside the champion on every metric a gate reads (`comparison`),
paired where the metric is per task, so a reviewer sees what changed, not only what was gated.

Latency is judged twice, apart: `p95_latency_ms` is an SLO (p95 <= X ms on the machine that measured it, so a busy
machine fails it whatever the model), and `champion_p95_ratio` is the comparison: candidate p95 / champion p95 over
the requests both answered, measured alternately in one window (`validation.evaluate`), with a paired interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from shiplift.tasks.errors import BadInput, GateFailed
from shiplift.validation.gate_power import paired_disagreement, plan_champion_checks
from shiplift.validation.metrics import (
    PAIRED_ACCURACY_METHOD,
    decision_metrics,
    latency_summary,
    paired_accuracy_difference,
    paired_ece_difference,
    paired_latency_ratio,
    paired_mean_difference,
    score_predictions,
    throughput,
)
from shiplift.validation.thresholds import RULE_TEXT, ChampionRule, DecisionRule, DecisionThresholds

Status = Literal["pass", "fail", "inconclusive", "skipped"]
SLO = "SLO <="  # the comparator of the p95 latency ceiling: an SLO on this machine, not a comparison
RATIO = "paired ratio ci_high <= threshold"  # the comparator of champion_p95_ratio
CHAMPION_CHECKS = {"accuracy": "champion_accuracy", "ece": "champion_ece", "p95_latency_ms": "champion_p95_ratio"}
Decision = Literal["pass", "fail", "inconclusive", "not_gated"]
NOT_GATED = "no thresholds: not a gate"
PERCENTILE = "percentile bootstrap"  # the interval of the ECE and p95-ratio champion checks


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
    rule: Literal["bound", "point", "paired"] | None = None  # None: a record written before rules were stated

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

    decision: Decision
    checks: list[Check]
    metrics: dict[str, Any]
    thresholds: DecisionThresholds | None
    decision_rule: DecisionRule = "bound"
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
        if self.decision == "not_gated":
            raise GateFailed(NOT_GATED, fix="set validation.thresholds in the release config")
        blocking = [f"{c.name}: {c.status} ({c.reason})" for c in self.checks if c.status in ("fail", "inconclusive")]
        raise GateFailed(
            f"gate decision is {self.decision}: " + "; ".join(blocking),
            fix="inspect gate-report.json; fix the candidate, or change the release config's thresholds if justified",
        )


def decide(checks: Sequence[Check]) -> Decision:
    """fail beats inconclusive beats pass; no check that judged anything (all skipped, or none) is `not_gated`."""
    statuses = {check.status for check in checks} - {"skipped"}
    if not statuses:
        return "not_gated"
    return "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"


def with_release_checks(report: dict, release: Mapping[str, Any] | None) -> dict:
    """A gate report (`GateReport.to_dict`) with the checks its pipeline measured beside the family's gate
    (`release["checks"]`, e.g. the cold start) added and judged with the others: one decision. A gate that judged
    nothing stays `not_gated` unless an added check fails."""
    added = list((release or {}).get("checks") or [])
    if not added:
        return report
    checks = [*report["checks"], *added]
    if report["decision"] == "not_gated":
        decision = "fail" if any(check["status"] == "fail" for check in added) else "not_gated"
    else:
        decision = decide([Check.model_validate({k: v for k, v in check.items() if k != "passed"}) for check in checks])
    return {**report, "checks": checks, "decision": decision}


def summary_line(decision: str, checks: Sequence[Mapping[str, Any]]) -> str:
    """One line for a log or a table: the decision and, unless it passed, every check that did not pass with its
    evidence and rule (`fail: allowed_token_mass 0.084 >= 0.1 (interval bound 0.071)`)."""
    if decision == "not_gated":
        return NOT_GATED
    blocking = [check for check in checks if check.get("status") in ("fail", "inconclusive")]
    if not blocking:
        return decision
    return f"{decision}: " + "; ".join(check_text(check) for check in blocking)


def check_text(check: Mapping[str, Any]) -> str:
    """A check's evidence in a few words: `accuracy 0.288 (needs >= 0.3; bound 0.21)`."""
    observed, threshold, rule = check.get("observed"), check.get("threshold"), check.get("rule")
    if observed is None:
        return f"{check['name']} not measured"
    text = f"{check['name']} {observed:.4g}"
    if threshold is not None and rule != "paired":
        comparator = check["comparator"].split()[-1] if check.get("comparator") else ""
        slo = check.get("comparator") == SLO
        text += f" ({'SLO: ' if slo else ''}needs {comparator} {threshold:.4g}{' ms on this machine' if slo else ''}"
        if rule == "bound" and check.get("ci"):
            low, high = check["ci"]
            text += f"; bound {low if comparator == '>=' else high:.4g}"
        return text + ")"
    if rule == "paired" and check.get("ci"):
        versus = "candidate / champion" if check.get("comparator") == RATIO else "vs champion"
        text += f" {versus}, CI [{check['ci'][0]:.4g}, {check['ci'][1]:.4g}], threshold {threshold:.4g}"
    return f"{text} ({check['status']})"


def absolute_check(name: str, observed: dict | None, threshold: float | None, comparator: str,
                   rule: DecisionRule = "bound") -> Check | None:
    """One absolute check (`comparator` ">=" for a floor, "<=" for a ceiling), None when its threshold is off. With
    `bound` the interval's conservative end must clear the threshold (its low end for a floor, its high end for a
    ceiling), with `point` the point estimate; a measurement with no rows fails either way."""
    if threshold is None:
        return None
    value = observed.get("value") if observed else None
    n = int(observed.get("n", 0)) if observed else 0
    ci = observed.get("ci") if observed else None
    if value is None:
        return Check(
            name=name, status="fail", observed=None, threshold=threshold, comparator=comparator, ci=None, n=n,
            rule=rule,
            reason="no rows to measure it on (every request failed or the value was not reported)",
        )
    floor = comparator == ">="
    judged = value if rule == "point" or not ci else (ci[0] if floor else ci[1])
    ok = judged >= threshold if floor else judged <= threshold
    what = "point estimate" if rule == "point" or not ci else f"interval {'low' if floor else 'high'} end"
    reason = f"{what} {judged:.6g} {comparator} {threshold:.6g} is {'true' if ok else 'false'}"
    if rule == "bound" and ci and (value >= threshold if floor else value <= threshold) and not ok:
        reason += f" (the point estimate {value:.6g} clears it; the interval [{ci[0]:.6g}, {ci[1]:.6g}] does not)"
    return Check(name=name, status="pass" if ok else "fail", observed=value, threshold=threshold,
                 comparator=comparator, ci=ci, n=n, reason=reason, rule=rule)


def latency_slo_check(p95: dict | None, max_ms: float | None, rule: DecisionRule = "bound") -> Check | None:
    """The p95 latency ceiling as what it is, an SLO on the machine that measured it (`absolute_check` with the
    comparator `SLO <=`); None when it is off. It judges the machine as much as the model: the champion comparison
    is `ratio_check`."""
    check = absolute_check("p95_latency_ms", p95, max_ms, "<=", rule)
    if check is None:
        return None
    return check.model_copy(update={"comparator": SLO,
                                    "reason": f"SLO: p95 <= {max_ms:g} ms on this machine; {check.reason}"})


def ratio_check(ratio: dict, *, max_ratio: float, min_samples: int) -> Check:
    """`champion_p95_ratio`: pass when the paired interval of candidate p95 / champion p95 lies wholly at or below
    `max_ratio`, fail when it lies wholly above, else inconclusive (also below `min_samples` shared requests)."""
    n, low_high = int(ratio["n"]), ratio["ci"]
    common = {"name": "champion_p95_ratio", "observed": ratio["ratio"], "threshold": max_ratio, "comparator": RATIO,
              "ci": low_high, "n": n, "rule": "paired"}
    if n < min_samples or low_high is None:
        return Check(**common, status="inconclusive",
                     reason=f"only {n} requests answered by both, fewer than min_samples={min_samples}: the gate "
                            "refuses to compare their latency")
    low, high = low_high
    status = "pass" if high <= max_ratio else "fail" if low > max_ratio else "inconclusive"
    return Check(**common, status=status,
                 reason=f"candidate p95 / champion p95 = {ratio['ratio']:.3f} ({ratio['candidate']:.0f} / "
                        f"{ratio['champion']:.0f} ms, measured alternately), CI [{low:.3f}, {high:.3f}], at most "
                        f"{max_ratio:g}")


def _champion_check(name: str, diff: dict, *, margin: float, min_samples: int, higher_is_better: bool) -> Check:
    n = int(diff["n"])
    threshold = -margin if higher_is_better else margin
    # pass when the whole paired interval clears the margin, fail when it lies wholly beyond it
    comparator = "paired ci_low >= threshold" if higher_is_better else "paired ci_high <= threshold"
    if n < min_samples:
        return Check(
            name=name, status="inconclusive", observed=diff["difference"], threshold=threshold,
            comparator=comparator, ci=diff["ci"], n=n, rule="paired",
            reason=f"only {n} shared tasks, fewer than min_samples={min_samples}: the gate refuses to decide",
        )
    low, high = diff["ci"]
    if higher_is_better:
        status = "pass" if low >= -margin else "fail" if high < -margin else "inconclusive"
    else:
        status = "pass" if high <= margin else "fail" if low > margin else "inconclusive"
    return Check(
        name=name, status=status, observed=diff["difference"], threshold=threshold, comparator=comparator,
        ci=diff["ci"], n=n, rule="paired",
        reason=f"candidate - champion = {diff['difference']:.4f}, CI [{low:.4f}, {high:.4f}], margin {margin:g}",
    )


def _check_gate_args(*, champion_given: bool, champion_rule: ChampionRule | None, decision_rule: DecisionRule,
                     n_bootstrap: int | None, seed: int | None) -> None:
    """BadInput for `evaluate_gates` arguments that cannot be judged with: champion predictions without their rule,
    an unknown decision rule, a bootstrap count under 100 or a negative seed."""
    if champion_given and champion_rule is None:
        raise BadInput(
            "champion predictions were given without a champion rule",
            fix="pass champion_rule=ChampionRule(...) from the release config's gate settings",
        )
    if decision_rule not in RULE_TEXT or decision_rule == "paired":
        raise BadInput(f"decision_rule must be 'bound' or 'point', got {decision_rule!r}",
                       fix="use 'bound' (the interval's conservative end) or 'point' (the point estimate)")
    bad_count = isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int) or n_bootstrap < 100
    if n_bootstrap is not None and bad_count:
        raise BadInput(f"n_bootstrap must be an integer >= 100, got {n_bootstrap!r}", fix="use e.g. 1000")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise BadInput(f"seed must be a non-negative integer, got {seed!r}", fix="use e.g. 0")


def evaluate_gates(
    candidate_preds: Sequence[Mapping[str, Any]],
    *,
    thresholds: DecisionThresholds | None,
    champion_preds: Sequence[Mapping[str, Any]] | None = None,
    champion_rule: ChampionRule | None = None,
    candidate_metrics: dict | None = None,
    n_bootstrap: int | None = None,
    seed: int | None = None,
    decision_rule: DecisionRule = "bound",
    latency_rows: tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]] | None = None,
    champion_timed: Sequence[Mapping[str, Any]] | None = None,
) -> GateReport:
    """Judge a candidate's predictions against absolute thresholds and, if given, the champion's.

    `thresholds` None (an ad-hoc evaluation) runs no absolute check. `latency_rows` (candidate's, champion's) are the
    requests the latency ratio pairs when one prediction is not one request (NLI: a batch of pairs is one request);
    None: the predictions. `champion_timed`: the champion's requests timed in this gate's window when `champion_preds`
    were recorded by an earlier gate (`validation.champion_reuse`); the champion's latency and the ratio read them.
    `decision_rule` is how every absolute check reads its evidence (`absolute_check`).
    `n_bootstrap` / `seed`, when given (the release's `validation.n_bootstrap` / `seed`), set the candidate's own
    intervals; the paired champion comparison always uses the champion rule's own `n_bootstrap` / `seed` (its accuracy
    check takes Tango's score interval at the rule's confidence instead: no resampling). The values used are recorded
    in the report's `bootstrap` (`champion_comparison` for the rule's, `champion_methods`: each check's interval)."""
    _check_gate_args(champion_given=champion_preds is not None, champion_rule=champion_rule,
                     decision_rule=decision_rule, n_bootstrap=n_bootstrap, seed=seed)
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
    checks: list[Check | None] = []
    if thresholds is not None:
        checks += [
            absolute_check("accuracy", metrics["accuracy"], thresholds.min_accuracy, ">=", decision_rule),
            absolute_check("ece", metrics["ece"], thresholds.max_ece, "<=", decision_rule),
            absolute_check("validity", metrics["validity"], thresholds.min_validity, ">=", decision_rule),
            latency_slo_check(latency["p95"], thresholds.max_p95_latency_ms, decision_rule),
            absolute_check("allowed_token_mass", metrics["allowed_token_mass"], thresholds.min_allowed_token_mass,
                           ">=", decision_rule),
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
        accuracy_diff = paired_accuracy_difference(candidate, incumbent, confidence=rule.confidence)
        ece_diff = paired_ece_difference(candidate, incumbent, **paired)
        checks.append(
            _champion_check(
                "champion_accuracy", accuracy_diff, margin=rule.margin, min_samples=rule.min_samples,
                higher_is_better=True,
            )
        )
        champion_metrics = decision_metrics(champion_preds, **boot)
        if champion_timed is not None:  # recorded rows: their latencies are another window's, so none is read
            champion_metrics.update(latency_ms=latency_summary(champion_timed, **boot),
                                    throughput=throughput(champion_timed))
        latency_ratio = paired_latency_ratio(
            *(latency_rows or (candidate_preds, champion_preds if champion_timed is None else champion_timed)),
            **paired)
        if rule.max_p95_ratio is not None:
            checks.append(ratio_check(latency_ratio, max_ratio=rule.max_p95_ratio, min_samples=rule.min_samples))
        champion.update(
            n=incumbent.n, n_valid=int(incumbent.valid.sum()), retries_503=incumbent.retries_503,
            errors=incumbent.errors, accuracy=accuracy_diff, metrics=champion_metrics, p95_ratio=latency_ratio,
            comparison=decision_comparison(metrics, champion_metrics, candidate, incumbent, paired,
                                           accuracy_diff=accuracy_diff, ece_diff=ece_diff, latency_ratio=latency_ratio),
            power=[plan.as_dict() for plan in plan_champion_checks(
                rule, accuracy_diff["n"], disagreements=[paired_disagreement(candidate_preds, champion_preds)])]
            if accuracy_diff["n"] else [],  # no shared task: nothing to plan on
        )
        sample_sizes.update(champion=incumbent.n, shared=accuracy_diff["n"])
        if rule.also_ece_margin is not None:
            checks.append(
                _champion_check(
                    "champion_ece", ece_diff, margin=rule.also_ece_margin, min_samples=rule.min_samples,
                    higher_is_better=False,
                )
            )
            champion["ece"] = ece_diff
            sample_sizes["shared_valid_both"] = ece_diff["n"]
    kept = [check for check in checks if check is not None]
    mark_gated(champion.get("comparison", []), kept)
    return GateReport(
        decision=decide(kept),
        checks=kept,
        metrics=metrics,
        thresholds=thresholds,
        decision_rule=decision_rule,
        champion_rule=champion_rule,
        sample_sizes=sample_sizes,
        champion=champion,
        bootstrap={**boot, "method": "percentile", "candidate_metrics": metrics.get("bootstrap"),
                   "champion_comparison": paired if champion_preds is not None else None,
                   "champion_methods": {"champion_accuracy": PAIRED_ACCURACY_METHOD, "champion_ece": PERCENTILE,
                                        "champion_p95_ratio": PERCENTILE} if champion_preds is not None else None},
    )


def mark_gated(rows: list[dict], checks: Sequence[Check]) -> None:
    """Name on each comparison row the checks that judged its metric (absolute and champion), none when only shown."""
    for row in rows:
        names = (row["metric"], CHAMPION_CHECKS.get(row["metric"], f"champion_{row['metric']}"))
        row["gated_by"] = [c.name for c in checks if c.status != "skipped" and c.name in names]


def comparison_row(metric: str, better: str, candidate: Mapping[str, Any] | None, champion: Mapping[str, Any] | None,
                   difference: Mapping[str, Any] | None = None) -> dict | None:
    """One metric, candidate beside champion: each one's value and interval, and candidate − champion (paired when
    `difference` is the paired comparison, else the plain difference of the two values with no interval). None
    when neither measured it (a metric that does not apply to the family)."""
    cand_value = candidate.get("value") if candidate else None
    champ_value = champion.get("value") if champion else None
    if cand_value is None and champ_value is None:
        return None
    if difference is not None:
        delta, delta_ci, n, is_paired = difference.get("difference"), difference.get("ci"), difference.get("n"), True
    else:
        both = cand_value is not None and champ_value is not None
        delta, delta_ci, n, is_paired = (cand_value - champ_value) if both else None, None, None, False
    return {
        "metric": metric, "better": better, "gated_by": [], "paired": is_paired, "n_shared": n,
        "candidate": {"value": cand_value, "ci": candidate.get("ci") if candidate else None},
        "champion": {"value": champ_value, "ci": champion.get("ci") if champion else None},
        "difference": delta, "difference_ci": delta_ci,
    }


def latency_row(candidate: Mapping[str, Any] | None, champion: Mapping[str, Any] | None,
                ratio: Mapping[str, Any]) -> dict | None:
    """The p95 latency row (per request): each side's p95 and interval, candidate − champion paired on the requests
    both answered (`validation.metrics.paired_latency_ratio`), and the ratio candidate / champion with its paired
    interval (`ratio`, `ratio_ci`); unpaired when they shared no request."""
    shared = ratio.get("n") and ratio.get("difference") is not None
    difference = {"difference": ratio["difference"], "ci": ratio["difference_ci"], "n": ratio["n"]} if shared else None
    row = comparison_row("p95_latency_ms", "lower", candidate, champion, difference)
    if row is not None:
        row.update(ratio=ratio.get("ratio"), ratio_ci=ratio.get("ci"))
    return row


def decision_comparison(metrics: dict, champion_metrics: dict, candidate, incumbent, paired: dict, *,
                        accuracy_diff: dict, ece_diff: dict, latency_ratio: dict) -> list[dict]:
    """Candidate vs champion on every metric a decision gate reads: accuracy, ECE, validity and allowed-token mass
    paired on the shared tasks; p95 latency (per request) paired on the requests both answered, with the ratio."""
    rows = [
        comparison_row("accuracy", "higher", metrics["accuracy"], champion_metrics["accuracy"], accuracy_diff),
        comparison_row("ece", "lower", metrics["ece"], champion_metrics["ece"], ece_diff),
        comparison_row("validity", "higher", metrics["validity"], champion_metrics["validity"],
                       paired_mean_difference(candidate, incumbent, lambda s: s.valid.astype(float), **paired)),
        comparison_row("allowed_token_mass", "higher", metrics["allowed_token_mass"],
                       champion_metrics["allowed_token_mass"],
                       paired_mean_difference(candidate, incumbent, lambda s: s.allowed_token_mass, **paired)),
        latency_row(metrics["latency_ms"]["p95"], champion_metrics["latency_ms"]["p95"], latency_ratio),
    ]
    return [row for row in rows if row is not None]
