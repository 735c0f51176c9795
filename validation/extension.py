"""The way out of an inconclusive champion check by extension: more paired tasks, judged again at planned looks.

When a decision gate's `champion_accuracy` or `champion_p95_ratio` check is inconclusive and the release chose
`validation.inconclusive.choice: extend`, `extend_champion_check` scores tasks of a reserve (datasets the first gate
never read, loaded and scored by the model family: `Reserve`) on the candidate and the champion, batch by batch,
alternating which goes first, and after each batch judges every inconclusive one of them again on all the paired tasks
so far (the first gate's and the reserve's), until each is decided, one fails (the gate then fails whatever the
others say), or the task or time budget is spent (what is still undecided stays inconclusive).

How each check's error is split, so that looking after every batch does not inflate it:
- accuracy: the first look is the gate's own paired score interval at the champion rule's confidence (a false pass there
  has probability about (1 − confidence)/2); `validation.sequential.sequential_champion_check`, a confidence
  sequence at the same confidence, adds at most (1 − confidence)/2 more over all its looks together (Ville's
  inequality).
- the latency ratio (candidate p95 / champion p95, `validation.metrics.paired_latency_ratio` on all paired requests
  so far, judged as `validation.gates.ratio_check` judges it): each of the K looks the budget plans (`planned`, fixed
  from the batch, the reserve and max_tasks before the first look) reads the paired bootstrap interval at confidence
  1 − (1 − confidence)/K, so by Bonferroni all K together add at most (1 − confidence)/2 per side. The union bound
  needs no model of how the looks depend on each other, only that their number is fixed in advance, as it is here
  (a time budget can take fewer looks, never more). Each tail is read at least `TAIL_DRAWS` resamples deep.
So a candidate truly worse by the margin (or truly slower than the ratio allows) is promoted with probability at most
1 − confidence overall (5 % at 0.95), and likewise failed when truly better. The ratio pairs the rows as requests: it
is extended only for a family whose prediction row is one request (`follow_choice` checks).
ECE's champion check (`also_ece_margin`) is not sequential: it is judged again once, at the end, by the paired
bootstrap on all the paired tasks the extension stopped at (a fixed-size interval read once more, so its error is the
bootstrap's at that size, not guarded against the optional stop).

Evidence beside the gate report: `extension.json` (every look of every extended check: tasks or requests, interval,
status; the final checks and decision), `extension-predictions.jsonl` and `champion-extension-predictions.jsonl` (the
rows it added). Imports no pipeline code.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shiplift.tasks.atomic import write_json_atomic
from shiplift.tasks.errors import BadInput, ConfigError
from shiplift.validation.champion_reuse import CHAMPION_LATENCY
from shiplift.validation.evaluate import Target
from shiplift.validation.gate_report import rewrite_reports
from shiplift.validation.gates import Check, _champion_check, decide, ratio_check
from shiplift.validation.metrics import paired_ece_difference, paired_latency_ratio, score_predictions
from shiplift.validation.report_parts import ReportParts
from shiplift.validation.runner import read_predictions
from shiplift.validation.sequential import extension_looks, sequential_champion_check
from shiplift.validation.thresholds import ChampionRule

EXTENSION_JSON = "extension.json"
CANDIDATE_ROWS = "extension-predictions.jsonl"
CHAMPION_ROWS = "champion-extension-predictions.jsonl"
ACCURACY, RATIO, ECE = "champion_accuracy", "champion_p95_ratio", "champion_ece"
EXTENDED = (ACCURACY, RATIO)  # the checks judged again at every look; ECE only once, at the end
TAIL_DRAWS = 10  # the ratio's bootstrap draws at least this many resamples beyond each end of its interval


@dataclass(frozen=True)
class Reserve:
    """A family's reserve: its tasks (each with an `id`), how one batch of them is scored on a target (prediction rows,
    `validation.runner.Prediction.to_dict`, in task order), the datasets' evidence and the family's report parts (the
    gate report is written again with the extension's decision)."""

    tasks: list
    score: Callable[[Target, list], list[dict]]
    datasets: list[dict]
    parts: ReportParts


@dataclass(frozen=True)
class Budget:
    """`validation.inconclusive.extend`'s limits: paired tasks per look, at most so many in all and so long."""

    batch: int
    max_tasks: int
    deadline_s: float


def differences(candidate_rows: Sequence[Mapping], champion_rows: Sequence[Mapping]) -> list[float]:
    """correct_candidate − correct_champion of the tasks both lists hold, in the candidate's order; an invalid or lost
    answer counts as wrong, as the gate counts it."""
    candidate, champion = score_predictions(candidate_rows), score_predictions(champion_rows)
    right = dict(zip(champion.ids, champion.correct, strict=True))
    return [float(ok) - float(right[ident]) for ident, ok in zip(candidate.ids, candidate.correct, strict=True)
            if ident in right]


def _append_rows(path: Path, rows: Sequence[Mapping]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, sort_keys=True) + "\n")


def _read_rows(path: Path) -> list[dict]:
    return [p.to_dict() for p in read_predictions(path)]


def judged_checks(first_checks: Sequence[Mapping], replaced: Mapping[str, Mapping]) -> list[dict]:
    """The gate's checks with those named in `replaced` (the extended checks' final ones, champion_ece judged again)
    put in their place."""
    return [dict(replaced.get(check["name"], check)) for check in first_checks]


def extension_summary(evidence: Mapping) -> dict:
    """What the gate report and the validate record keep of an extension's evidence: its outcome, each extended
    check's, and every look."""
    return {key: evidence[key]
            for key in ("status", "n", "extended", "reason", "stopped", "reserve_tasks_scored", "looks")}


def ratio_look(candidate_rows: Sequence[Mapping], champion_rows: Sequence[Mapping], rule: ChampionRule, *,
               look: int, planned: int) -> Check:
    """`champion_p95_ratio` at look `look` of `planned`: `ratio_check` on the paired bootstrap interval of all the
    paired requests so far, at the Bonferroni confidence 1 − (1 − confidence)/planned (the module's docstring)."""
    alpha = (1.0 - rule.confidence) / planned
    draws = max(rule.n_bootstrap, math.ceil(TAIL_DRAWS / (alpha / 2.0)))
    ratio = paired_latency_ratio(candidate_rows, champion_rows, n_bootstrap=draws, seed=rule.seed,
                                 confidence=1.0 - alpha)
    check = ratio_check(ratio, max_ratio=rule.max_p95_ratio, min_samples=rule.min_samples)
    return check.model_copy(update={"reason": f"look {look} of {planned}, interval at {1.0 - alpha:.4g} (Bonferroni: "
                                              f"{rule.confidence:g} over {planned} planned looks): {check.reason}"})


def _look_row(number: int, check: Mapping, method: str) -> dict:
    """One row of the looks table (extension.json, the report's Extension section): a check as one look judged it."""
    return {"look": number, "check": check["name"], "n": check["n"], "interval": check["ci"],
            "status": check["status"], "method": method}


def _accuracy_check(diffs: list[float], looked: list[int], rule: ChampionRule) -> dict:
    """champion_accuracy judged by the confidence sequence at the looks so far (`looked`, paired-task counts)."""
    result = sequential_champion_check(diffs, margin=rule.margin, confidence=rule.confidence, looks=looked)
    return Check(name=ACCURACY, status=result.status, observed=sum(diffs[:result.n]) / result.n,
                 threshold=-rule.margin, comparator="sequence rejects mean <= threshold", ci=list(result.interval),
                 n=result.n, rule="paired", reason=result.reason).model_dump(mode="json")


def _judge_again(judged: dict[str, dict], pending: Sequence[str], rule: ChampionRule, *, look: int, planned: int,
                 diffs: list[float], looked: list[int], rows: tuple[list[dict], list[dict]],
                 say: Callable[[str], None]) -> list[dict]:
    """Judge each pending check not yet decided (in `judged`, updated) on all paired tasks so far, at look `look` of
    `planned`; return the looks' rows."""
    added = []
    for name in pending:
        if judged.get(name, {}).get("status", "inconclusive") != "inconclusive":
            continue  # decided at an earlier look: its verdict stands
        if name == ACCURACY:
            judged[name] = _accuracy_check(diffs, looked, rule)
            method = "betting confidence sequence"
        else:
            judged[name] = ratio_look(*rows, rule, look=look, planned=planned).model_dump(mode="json")
            method = f"paired bootstrap of the p95 ratio, Bonferroni over {planned} looks"
        added.append(_look_row(look, judged[name], method))
        ci = judged[name]["ci"]
        interval = f"interval [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "no interval"
        say(f"extend: look {look}/{planned}: {name} on {judged[name]['n']}: {interval}: {judged[name]['status']}")
    return added


def _planned_looks(first_n: int, max_tasks: int, budget: Budget, rule: ChampionRule) -> list[int]:
    """The paired-task counts the extension will look at, fixed before the first: every batch up to max_tasks, none
    before the rule's min_samples paired tasks (the gate refuses to decide on fewer, and so does the sequence)."""
    if not max_tasks:
        return []
    return [n for n in extension_looks(first_n, batch=budget.batch, max_tasks=max_tasks) if n >= rule.min_samples]


def extend_champion_check(out_dir: Path, *, candidate: Target, champion: Target, reserve: Reserve, rule: ChampionRule,
                          budget: Budget, title: str, progress: Callable[[str], None] | None = None,
                          clock: Callable[[], float] = time.monotonic) -> dict:
    """Extend the inconclusive champion checks (accuracy, the p95 ratio) of the gate written to `out_dir` (its
    gate-report.json and the two predictions files) on `reserve`, within `budget`; write the evidence beside it,
    write the gate report (titled `title`) again with the final decision and checks beside the first look, and return
    extension.json's content: `decision` (the gate's decision once the checks are judged again), `checks`, `status`,
    `extended` (each extended check's final status, size, interval and reason), `looks`, `n` (paired tasks), `reason`,
    `stopped` (decided, tasks or time) and what it scored."""
    out_dir = Path(out_dir)
    say = progress or (lambda message: None)
    started = clock()
    report = json.loads((out_dir / "gate-report.json").read_text(encoding="utf-8"))
    # the gate's own first look: a report an extension already rewrote keeps it apart, and a rerun starts from it
    gate = report.get("first_look") or {"decision": report["decision"], "checks": report["checks"]}
    first = {c["name"]: c for c in gate["checks"]}
    pending = [name for name in EXTENDED if first.get(name, {}).get("status") == "inconclusive"]
    if not pending:
        raise BadInput(f"the gate in {out_dir} has no inconclusive {' or '.join(EXTENDED)} check to extend",
                       fix="extend only a gate whose champion accuracy or latency ratio check is inconclusive")
    if RATIO in pending and rule.max_p95_ratio is None:
        raise BadInput(f"the gate in {out_dir} judged {RATIO} but the champion rule given sets no max_p95_ratio",
                       fix="pass the champion rule the gate was judged with (validation.champion)")
    gate_rows = _read_rows(out_dir / "predictions.jsonl")  # the gate's own: the report's per-task table
    candidate_rows = list(gate_rows)
    champion_rows = _read_rows(out_dir / "champion-predictions.jsonl")
    # the latency ratio pairs only requests timed in this window: a reused champion's live sample, not its recorded rows
    sampled = out_dir / CHAMPION_LATENCY
    champion_timed = _read_rows(sampled) if sampled.is_file() else list(champion_rows)
    diffs = differences(candidate_rows, champion_rows)
    overlap = sorted({str(task.id) for task in reserve.tasks} & {row["id"] for row in candidate_rows})
    if overlap:
        raise ConfigError(f"{len(overlap)} reserve tasks are also gate tasks (e.g. {overlap[0]}): extending on them "
                          "would count them twice", fix="give validation.inconclusive.extend.datasets tasks the gate "
                                                        "does not read (another file or split)")
    first_n, max_tasks = len(diffs), min(budget.max_tasks, len(reserve.tasks))
    planned = _planned_looks(first_n, max_tasks, budget, rule)
    for path in (out_dir / CANDIDATE_ROWS, out_dir / CHAMPION_ROWS):
        path.write_text("", encoding="utf-8")
    methods = report["bootstrap"].get("champion_methods") or {}  # none in a report from before they were named
    looks = [_look_row(0, first[name], f"{methods.get(name, 'paired bootstrap')} (the gate's first look)")
             for name in pending]
    say(f"extend: {', '.join(pending)} inconclusive on {first_n} paired tasks; up to {max_tasks} reserve tasks in "
        f"batches of {budget.batch}, {budget.deadline_s:g} s at most")
    judged: dict[str, dict] = {}  # each extended check at its latest look (its deciding one once decided)
    stopped, scored, looked = "tasks", 0, []
    for number, look in enumerate(planned, start=1):
        if clock() - started >= budget.deadline_s:
            stopped = "time"
            break
        batch = reserve.tasks[scored: look - first_n]
        order = [("candidate", candidate), ("champion", champion)]
        rows: dict[str, list[dict]] = {}
        for role, target in order if number % 2 else order[::-1]:  # alternate who answers first: drift hits both
            rows[role] = reserve.score(target, batch)
        _append_rows(out_dir / CANDIDATE_ROWS, rows["candidate"])
        _append_rows(out_dir / CHAMPION_ROWS, rows["champion"])
        candidate_rows += rows["candidate"]
        champion_rows += rows["champion"]
        champion_timed += rows["champion"]
        scored += len(batch)
        diffs += differences(rows["candidate"], rows["champion"])  # the batch's pairs, after those before it
        looked.append(len(diffs))
        looks += _judge_again(judged, pending, rule, look=number, planned=len(planned), diffs=diffs, looked=looked,
                              rows=(candidate_rows, champion_timed), say=say)
        statuses = [judged[name]["status"] for name in pending]
        if "fail" in statuses or "inconclusive" not in statuses:
            stopped = "decided"
            break
    finals = {name: _final(name, first[name], judged.get(name), stopped=stopped, budget=budget, first_n=first_n,
                           max_tasks=max_tasks, rule=rule) for name in pending}
    if rule.also_ece_margin is not None:
        ece_diff = paired_ece_difference(score_predictions(candidate_rows), score_predictions(champion_rows),
                                         n_bootstrap=rule.n_bootstrap, seed=rule.seed, confidence=rule.confidence)
        finals[ECE] = _champion_check(ECE, ece_diff, margin=rule.also_ece_margin, min_samples=rule.min_samples,
                                      higher_is_better=False).model_dump(mode="json")
        finals[ECE]["reason"] += f" (judged once more on all {ece_diff['n']} paired tasks after the extension)"
    checks = judged_checks(gate["checks"], finals)
    decision = decide([Check.model_validate({k: v for k, v in c.items() if k != "passed"}) for c in checks])
    status = decide([Check.model_validate(finals[name]) for name in pending])
    evidence = {"decision": decision, "first_decision": gate["decision"], "checks": checks, "status": status,
                "n": len(diffs), "reason": "; ".join(f"{name}: {finals[name]['reason']}" for name in pending),
                "extended": {name: {key: finals[name][key] for key in ("status", "n", "ci", "reason")}
                             for name in pending},
                "stopped": stopped, "looks": looks, "planned_looks": planned, "reserve_tasks_scored": scored,
                "reserve": reserve.datasets, "margin": rule.margin, "max_p95_ratio": rule.max_p95_ratio,
                "confidence": rule.confidence, "seconds": round(clock() - started, 3),
                "error_split": "first look: the gate's paired interval, (1 - confidence)/2 per side; after it, another "
                               "(1 - confidence)/2 per side over all looks: the accuracy's confidence sequence, the "
                               "latency ratio's Bonferroni over the planned looks"}
    write_json_atomic(out_dir / EXTENSION_JSON, evidence)
    rewrite_reports(out_dir, predictions=gate_rows, title=title, parts=reserve.parts, changes={
        "decision": decision, "checks": checks, "extension": extension_summary(evidence),
        "first_look": gate})
    say(f"extend: {status} after {len(diffs)} paired tasks ({stopped}); gate decision {gate['decision']} -> "
        f"{decision}")
    return evidence


def _final(name: str, first: Mapping, judged: Mapping | None, *, stopped: str, budget: Budget, first_n: int,
           max_tasks: int, rule: ChampionRule) -> dict:
    """An extended check's final form: its latest look's, or the first look's when no look judged it, with why."""
    if judged is None:
        why = ("the time budget was spent" if stopped == "time" else "the reserve is empty" if not max_tasks else
               f"the gate's and the reserve's {first_n + max_tasks} paired tasks are fewer than min_samples="
               f"{rule.min_samples}")
        kept = {key: value for key, value in first.items() if key != "passed"}
        return {**kept, "reason": f"extended: no look was taken ({why}); the first look stands: {first['reason']}"}
    spent = f"; stopped: {budget.deadline_s:g} s spent" if stopped == "time" else ""
    return {**judged, "reason": f"extended: {judged['reason']}{spent}"}
