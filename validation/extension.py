"""The way out of an inconclusive champion check by extension: more paired tasks, judged by a confidence sequence.

When a decision gate's `champion_accuracy` check is inconclusive (its paired interval straddles −margin) and the
release chose `validation.inconclusive.choice: extend`, `extend_champion_check` scores tasks of a reserve (datasets the
first gate never read, loaded and scored by the model family: `Reserve`) on the candidate and the champion, batch by
batch, alternating which goes first, and after each batch judges every paired task so far (the first gate's and the
reserve's) with `validation.sequential.sequential_champion_check`, until it passes or fails or the task or time budget
is spent (then it stays inconclusive).

How the error is split: the first look is the gate's own paired bootstrap at the champion rule's confidence (a false
pass there has probability about (1 − confidence)/2); the sequence, at the same confidence, adds at most
(1 − confidence)/2 more over all its looks together (Ville's inequality). So a candidate truly worse by the margin is
promoted with probability at most 1 − confidence overall (5 % at 0.95), and likewise failed when truly better.
ECE's champion check (`also_ece_margin`) is not sequential: it is judged again once, at the end, by the paired
bootstrap on all the paired tasks the extension stopped at (a fixed-size interval read once more, so its error is the
bootstrap's at that size, not guarded against the optional stop).

Evidence beside the gate report: `extension.json` (every look: tasks, interval, status; the final checks and decision),
`extension-predictions.jsonl` and `champion-extension-predictions.jsonl` (the rows it added). Imports no pipeline code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shiplift.tasks.atomic import write_json_atomic
from shiplift.tasks.errors import ConfigError
from shiplift.validation.evaluate import Target
from shiplift.validation.gate_report import rewrite_reports
from shiplift.validation.gates import Check, _champion_check, decide
from shiplift.validation.metrics import paired_ece_difference, score_predictions
from shiplift.validation.report_parts import ReportParts
from shiplift.validation.runner import read_predictions
from shiplift.validation.sequential import extension_looks, sequential_champion_check
from shiplift.validation.thresholds import ChampionRule

EXTENSION_JSON = "extension.json"
CANDIDATE_ROWS = "extension-predictions.jsonl"
CHAMPION_ROWS = "champion-extension-predictions.jsonl"


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


def judged_checks(first_checks: Sequence[Mapping], final: Mapping, ece: Mapping | None) -> list[dict]:
    """The gate's checks with champion_accuracy judged by the sequence (`final`: its check) and champion_ece, when
    given, judged again on all paired tasks."""
    replaced = {"champion_accuracy": final, **({"champion_ece": ece} if ece is not None else {})}
    return [dict(replaced.get(check["name"], check)) for check in first_checks]


def extension_summary(evidence: Mapping) -> dict:
    """What the gate report and the validate record keep of an extension's evidence: its outcome and every look."""
    return {key: evidence[key]
            for key in ("status", "n", "interval", "reason", "stopped", "reserve_tasks_scored", "looks")}


def extend_champion_check(out_dir: Path, *, candidate: Target, champion: Target, reserve: Reserve, rule: ChampionRule,
                          budget: Budget, title: str, progress: Callable[[str], None] | None = None,
                          clock: Callable[[], float] = time.monotonic) -> dict:
    """Extend the inconclusive champion check of the gate written to `out_dir` (its gate-report.json and the two
    predictions files) on `reserve`, within `budget`; write the evidence beside it, write the gate report (titled
    `title`) again with the final decision and checks beside the first look, and return extension.json's content:
    `decision` (the gate's decision once the check is judged again), `checks`, `status`, `looks`, `n`, `interval`,
    `reason`, `stopped` (decided, tasks or time) and what it scored."""
    out_dir = Path(out_dir)
    say = progress or (lambda message: None)
    started = clock()
    report = json.loads((out_dir / "gate-report.json").read_text(encoding="utf-8"))
    first = next(c for c in report["checks"] if c["name"] == "champion_accuracy")
    gate_rows = _read_rows(out_dir / "predictions.jsonl")  # the gate's own: the report's per-task table
    candidate_rows = list(gate_rows)
    champion_rows = _read_rows(out_dir / "champion-predictions.jsonl")
    diffs = differences(candidate_rows, champion_rows)
    overlap = sorted({str(task.id) for task in reserve.tasks} & {row["id"] for row in candidate_rows})
    if overlap:
        raise ConfigError(f"{len(overlap)} reserve tasks are also gate tasks (e.g. {overlap[0]}): extending on them "
                          "would count them twice", fix="give validation.inconclusive.extend.datasets tasks the gate "
                                                        "does not read (another file or split)")
    first_n, max_tasks = len(diffs), min(budget.max_tasks, len(reserve.tasks))
    # no look before the rule's min_samples paired tasks: the gate refuses to decide on fewer, and so does the sequence
    planned = [n for n in (extension_looks(first_n, batch=budget.batch, max_tasks=max_tasks) if max_tasks else [])
               if n >= rule.min_samples]
    for path in (out_dir / CANDIDATE_ROWS, out_dir / CHAMPION_ROWS):
        path.write_text("", encoding="utf-8")
    looks: list[dict] = [{"look": 0, "n": first_n, "interval": first["ci"], "status": first["status"],
                          "method": "paired bootstrap (the gate's first look)"}]
    say(f"extend: the champion check is inconclusive on {first_n} paired tasks; up to {max_tasks} reserve tasks in "
        f"batches of {budget.batch}, {budget.deadline_s:g} s at most")
    result, stopped, scored = None, "tasks", 0
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
        scored += len(batch)
        diffs += differences(rows["candidate"], rows["champion"])  # the batch's pairs, after those before it
        result = sequential_champion_check(diffs, margin=rule.margin, confidence=rule.confidence,
                                           looks=[entry["n"] for entry in looks[1:]] + [len(diffs)])
        looks.append({"look": number, "n": result.n, "interval": list(result.interval), "status": result.status,
                      "method": "betting confidence sequence"})
        say(f"extend: look {number}/{len(planned)}: {result.n} paired tasks, interval "
            f"[{result.interval[0]:.4f}, {result.interval[1]:.4f}] against -{rule.margin:g}: {result.status}")
        if result.status != "inconclusive":
            stopped = "decided"
            break
    if result is None:
        status, n, interval = "inconclusive", first_n, first["ci"]
        why = ("the time budget was spent" if stopped == "time" else "the reserve is empty" if not max_tasks else
               f"the gate's and the reserve's {first_n + max_tasks} paired tasks are fewer than min_samples="
               f"{rule.min_samples}")
        reason = f"no look was taken ({why}); the first look stands: {first['reason']}"
    else:
        status, n, interval = result.status, result.n, list(result.interval)
        reason = result.reason + ("" if stopped != "time" else f"; stopped: {budget.deadline_s:g} s spent")
    final = Check(name="champion_accuracy", status=status, observed=sum(diffs) / len(diffs) if diffs else None,
                  threshold=-rule.margin, comparator="sequence rejects mean <= threshold", ci=interval, n=n,
                  rule="paired", reason=f"extended: {reason}").model_dump(mode="json")
    ece = None
    if rule.also_ece_margin is not None:
        ece_diff = paired_ece_difference(score_predictions(candidate_rows), score_predictions(champion_rows),
                                         n_bootstrap=rule.n_bootstrap, seed=rule.seed, confidence=rule.confidence)
        ece = _champion_check("champion_ece", ece_diff, margin=rule.also_ece_margin, min_samples=rule.min_samples,
                              higher_is_better=False).model_dump(mode="json")
        ece["reason"] += f" (judged once more on all {ece_diff['n']} paired tasks after the extension)"
    checks = judged_checks(report["checks"], final, ece)
    decision = decide([Check.model_validate({k: v for k, v in c.items() if k != "passed"}) for c in checks])
    evidence = {"decision": decision, "first_decision": report["decision"], "checks": checks, "status": status, "n": n,
                "interval": interval, "reason": reason, "stopped": stopped, "looks": looks, "planned_looks": planned,
                "reserve_tasks_scored": scored, "reserve": reserve.datasets, "margin": rule.margin,
                "confidence": rule.confidence, "seconds": round(clock() - started, 3),
                "error_split": "first look: the paired bootstrap, (1 - confidence)/2 per side; the sequence: another "
                               "(1 - confidence)/2 per side over all its looks"}
    write_json_atomic(out_dir / EXTENSION_JSON, evidence)
    rewrite_reports(out_dir, predictions=gate_rows, title=title, parts=reserve.parts, changes={
        "decision": decision, "checks": checks, "extension": extension_summary(evidence),
        "first_look": {"decision": report["decision"], "checks": report["checks"]}})
    say(f"extend: {status} after {n} paired tasks ({stopped}); gate decision {report['decision']} -> {decision}")
    return evidence
