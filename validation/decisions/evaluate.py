"""Evaluate any decision endpoint (SemIf, or chat completions through its readout) on decision datasets, gate it, and
write the evidence to a folder.

A candidate and its champion are scored side by side (`validation.evaluate.side_by_side`): in alternate turns of a few
tasks each, in one window on one machine, so that their latencies can be compared (the gate's `champion_p95_ratio`)
whatever else loads the machine.

Writes `predictions.jsonl` (and `champion-predictions.jsonl` when a champion is compared),
`gate-report.json` and `report.html`: everything needed to recompute every number. A champion whose per-task results
an earlier gate recorded (`validation.champion_reuse`) is not scored again: `champion-predictions.jsonl` holds the
recorded rows, and `champion-latency-predictions.jsonl` the sample it answered live for the latency ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from shiplift.validation.champion_reuse import CHAMPION_LATENCY, latency_turns, reused_rows
from shiplift.validation.evaluate import (
    DEFAULT_SETTINGS,
    TURN_PER_WORKER,
    RunSettings,
    Side,
    Target,
    Turn,
    progress_counter,
    side_by_side,
    turns_of,
)
from shiplift.validation.gate_report import write_reports
from shiplift.validation.gates import evaluate_gates, with_release_checks
from shiplift.validation.report_parts import ReportParts
from shiplift.validation.runner import SEMIF, Prediction, run_decisions, write_predictions

DECISION_REPORT = ReportParts(  # a decision gate's parts of its report (SemIf and the chat readout alike)
    item="task", items="tasks",
    estimates=("accuracy", "validity", "ece", "brier", "nll", "allowed_token_mass"),
)


def score_decisions(sides: Sequence[Side], datasets: list, settings: RunSettings,
                    notice: Callable[[str], None] | None = None, *, latency_sample: int | None = None) -> list[list]:
    """Every dataset's tasks through each side, alternately in turns when there are two (`side_by_side`; one side
    runs each dataset in one go); each side's predictions in task order. With `latency_sample` (a champion whose
    recorded results are reused) the second side answers only enough turns, spread over the gate, for that many
    tasks (`validation.champion_reuse.latency_turns`), alternated with the first as always."""
    def score(target: Target, turn: Turn, requests: dict) -> list:
        return run_decisions(target.invoker, turn.items, concurrency=settings.concurrency,
                             dataset_name=turn.dataset.name,
                             readout=settings.readout or SEMIF, **requests)

    turns = turns_of(datasets, sides, TURN_PER_WORKER * settings.concurrency)
    live = range(len(turns)) if latency_sample is None else latency_turns([len(t.items) for t in turns],
                                                                             latency_sample)
    side_by_side(sides, turns, score, lambda predictions: all(p.lost for p in predictions), settings, notice,
                 first_only=frozenset(range(len(turns))) - frozenset(live))
    return [[p for outcome in side.outcomes for p in outcome] for side in sides]


def champion_rows(champion: Target | None, datasets: list,
                  say: Callable[[str], None]) -> tuple[list[dict] | None, dict | None]:
    """The champion's recorded rows the gate reuses for every task (`validation.champion_reuse.reused_rows`), or None
    when it scores the champion on every task; and what the report says of the champion's evidence (None: no offer,
    so nothing to say)."""
    if champion is None or champion.offer is None:
        return None, None
    rows, evidence = reused_rows(champion.offer, datasets)
    if rows is None:
        say(f"{champion.label}: scoring it on every task: {evidence['why']}")
        return None, evidence
    say(f"{champion.label}: reusing its per-task results from release {evidence['from_release']}'s "
        f"{evidence['file']} ({evidence['n']} tasks); latency measured live on {champion.offer.latency_sample} "
        "tasks, alternated with the candidate")
    return rows, {**evidence, "latency_sample": champion.offer.latency_sample}


def evaluate_decisions(
    candidate: Target,
    datasets: list,
    out_dir: Path,
    *,
    thresholds,
    champion_rule,
    champion: Target | None = None,
    settings: RunSettings = DEFAULT_SETTINGS,
    progress: Callable[[str], None] | None = None,
    title: str = "shiplift decision gate",
    decision_rule: str = "bound",
    context: Callable[[dict], dict] | None = None,
) -> dict:
    """Score the candidate (and the champion on the same tasks, alternately: `side_by_side`; a champion whose `offer`
    holds recorded results for every task only on its latency sample: `champion_rows`), gate, and write the
    reports; `thresholds` None (an ad-hoc evaluation) measures without judging; `context`, called with the measured
    metrics, returns the report's RELEASE_CONTEXT."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda message: None)
    sides = [Side(target, progress_counter(say, target.label or role))
             for target, role in ((candidate, "candidate"), (champion, "champion")) if target is not None]
    reused, champion_evidence = champion_rows(champion, datasets, say)
    candidate_predictions, *champion_predictions = score_decisions(
        sides, datasets, settings, say, latency_sample=None if reused is None else champion.offer.latency_sample)
    write_predictions(out_dir / "predictions.jsonl", candidate_predictions)
    candidate_rows = [p.to_dict() for p in candidate_predictions]
    incumbent_rows, timed = None, None
    (out_dir / CHAMPION_LATENCY).unlink(missing_ok=True)  # an earlier run's sample is no evidence of this one
    if reused is not None:  # accuracy and ECE on the recorded rows; the champion's latency on the live sample
        write_predictions(out_dir / "champion-predictions.jsonl", [Prediction.model_validate(r) for r in reused])
        write_predictions(out_dir / CHAMPION_LATENCY, champion_predictions[0])
        incumbent_rows, timed = reused, [p.to_dict() for p in champion_predictions[0]]
    elif champion_predictions:
        write_predictions(out_dir / "champion-predictions.jsonl", champion_predictions[0])
        incumbent_rows = [p.to_dict() for p in champion_predictions[0]]
    report = evaluate_gates(
        candidate_rows, thresholds=thresholds, champion_preds=incumbent_rows, champion_rule=champion_rule,
        n_bootstrap=settings.n_bootstrap, seed=settings.seed, decision_rule=decision_rule, champion_timed=timed,
    ).to_dict()
    if champion_evidence is not None:
        report["champion"]["evidence"] = champion_evidence
    losses = (settings.readout or SEMIF).losses(candidate_rows)
    if losses is not None:
        report["metrics"]["readout"] = losses
    release = context(report["metrics"]) if context else None
    report = with_release_checks(report, release)  # the pipeline's own checks (a cold start) judged with the gate's
    extra = {
        "datasets": [d.evidence() for d in datasets],
        "candidate": candidate.describe(),
        "champion": None if champion is None else champion.describe(),
        "readout": (settings.readout.name if settings.readout else "semif"),
        "release": release,
    }
    paths = write_reports(out_dir, gate_report=report, predictions=candidate_rows, title=title, parts=DECISION_REPORT,
                          extra=extra)
    return {**report, "paths": {k: str(v) for k, v in paths.items()}, "datasets": extra["datasets"]}
