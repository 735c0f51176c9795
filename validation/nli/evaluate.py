"""Evaluate any encoder endpoint on NLI datasets, gate it, and write the evidence to a folder.

Mirrors validation.decisions.evaluate.evaluate_decisions: the decision metrics and gates (accuracy, ECE,
Brier, NLL, validity, champion comparison) run unchanged on decision-shaped predictions; the NLI
metrics (macro-F1, per-class recall with bootstrap intervals, the confusion matrix) and their
absolute thresholds are added to the same gate report. Latency and throughput are counted per
request, where one batch of pairs is one request (the p95 check reads that); the per-pair share of
a batch's latency is reported apart as a cost per item. Writes `predictions.jsonl`
(and `champion-predictions.jsonl`), `gate-report.json` and `report.html`. Truncated pairs are
counted and listed in the result and the report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from shiplift.tasks.errors import BadInput
from shiplift.validation.datasets import CheckedDataset, keep_splits
from shiplift.validation.evaluate import (
    DEFAULT_SETTINGS,
    TURN_PER_WORKER,
    RunSettings,
    Side,
    Target,
    progress_counter,
    side_by_side,
    turns_of,
)
from shiplift.validation.gate_report import write_reports
from shiplift.validation.gates import (
    ChampionRule,
    Check,
    DecisionThresholds,
    absolute_check,
    comparison_row,
    decide,
    evaluate_gates,
    latency_row,
    mark_gated,
    with_release_checks,
)
from shiplift.validation.metrics import (
    bootstrap_ci,
    decision_metrics,
    latency_summary,
    macro_f1,
    paired_bootstrap,
    per_class_recall,
    score_predictions,
)
from shiplift.validation.nli.expectations import check_nli_pairs
from shiplift.validation.nli.pairs import LABELS, NliPair, load_nli
from shiplift.validation.nli.runner import NliRun, run_pairs
from shiplift.validation.report_parts import ReportParts
from shiplift.validation.runner import write_predictions
from shiplift.validation.thresholds import NliThresholds

INVALID = "invalid"  # the confusion matrix's column for rows with no valid answer
LATENCY_NOTE = (
    "latency is counted per request: one batch of pairs is one request (metrics.latency_ms, over extra.requests); "
    "the per-pair share, each prediction's latency_ms / server_forward_ms / server_total_ms = the batch's value "
    "divided by its number of pairs, is reported apart (metrics.latency_per_item_ms): a cost per item, not a latency"
)


def _nli_rows(metrics: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The NLI block's headline rows: macro-F1, then each class's recall."""
    nli = metrics.get("nli") or {}
    if not nli:
        return []
    recall = nli.get("per_class_recall") or {}
    return [("macro_f1", nli.get("macro_f1")), *((f"recall_{label}", est) for label, est in recall.items())]


def _confusions(report: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The candidate's confusion matrix, and the champion's when one was compared."""
    blocks = (("candidate", (report.get("metrics") or {}).get("nli")),
              ("champion", (report.get("champion") or {}).get("nli")))
    return [(who, block["confusion"]) for who, block in blocks if (block or {}).get("confusion")]


NLI_REPORT = ReportParts(  # an NLI gate's parts of its report: pairs in batches, its own rows and confusion matrices
    item="pair", items="pairs", request_items="pairs",  # RequestTiming.pairs
    estimates=("accuracy", "validity", "ece", "brier", "nll"),
    labels={"macro_f1": "macro-F1", **{f"recall_{label}": f"recall: {label}" for label in LABELS}},
    family_rows=_nli_rows, confusions=_confusions,
)


@dataclass(frozen=True, kw_only=True)
class NliDataset(CheckedDataset):
    """Pairs ready for the runner plus the evidence the gate records about them (with the unlabelled rows dropped)."""

    pairs: list[NliPair]
    dropped_unlabelled: int

    @property
    def items(self) -> list[NliPair]:
        return self.pairs

    def counts(self) -> dict[str, int]:
        return {"dropped_unlabelled": self.dropped_unlabelled}


def load_nli_dataset(path: str | Path, *, name: str, splits: Sequence[str] | None = None) -> NliDataset:
    """Read an NLI file, keep the given splits (all when None), and check it before use."""
    loaded = load_nli(path)
    pairs = keep_splits(loaded.pairs, splits, where=f"NLI file {loaded.path}", unit="pairs",
                        fix="pass splits that the file has")
    check = check_nli_pairs(pairs, name=name)
    return NliDataset(
        name=name, path=Path(loaded.path), sha256=loaded.sha256, splits=tuple(splits) if splits else None,
        pairs=pairs, dropped_unlabelled=loaded.dropped_unlabelled, check=check.to_dict(),
    )


def nli_metrics(
    predictions: Sequence[Mapping[str, Any]], *, n_bootstrap: int = 1000, seed: int = 0, confidence: float = 0.95
) -> dict:
    """Macro-F1 and per-class recall (invalid rows count as misses) with percentile-bootstrap intervals."""
    scored = score_predictions(predictions)
    truth = [str(row["expected"]) for row in predictions]
    guess = scored.predicted
    n = len(truth)
    boot = {"n_bootstrap": n_bootstrap, "seed": seed, "confidence": confidence}
    f1_ci = bootstrap_ci(
        lambda idx: macro_f1([truth[i] for i in idx], [guess[i] for i in idx], LABELS), n, **boot
    )
    recall = per_class_recall(truth, guess, LABELS)
    per_class = {}
    for label in LABELS:
        hits = np.asarray([g == label for t, g in zip(truth, guess, strict=True) if t == label], dtype=float)
        ci = bootstrap_ci(lambda idx, hits=hits: float(hits[idx].mean()), hits.size, **boot)
        per_class[label] = {"value": recall[label], "ci": ci, "n": int(hits.size)}
    predicted = [*LABELS, INVALID] if any(g is None for g in guess) else list(LABELS)
    cells = Counter((t, INVALID if g is None else g) for t, g in zip(truth, guess, strict=True))
    counts = [[cells[(row, column)] for column in predicted] for row in LABELS]
    return {
        "labels": list(LABELS),
        "confusion": {"true": list(LABELS), "predicted": predicted, "counts": counts,
                      "note": "rows: true label; columns: predicted label (invalid: no valid answer)"},
        "macro_f1": {"value": macro_f1(truth, guess, LABELS), "ci": f1_ci, "n": n},
        "per_class_recall": per_class,
        "predicted_counts": {label: sum(1 for g in guess if g == label) for label in LABELS},
        "invalid_predictions": sum(1 for g in guess if g is None),
        "bootstrap": {**boot, "method": "percentile", "unit": "rows (per-class recall: rows of that class)"},
    }


def _mean_at(hits: np.ndarray, idx) -> float:
    """The mean of `hits` over one bootstrap resample's indices `idx`."""
    return float(hits[idx].mean())


def nli_comparison(candidate_rows: Sequence[Mapping[str, Any]], champion_rows: Sequence[Mapping[str, Any]],
                   nli: dict, champion_nli: dict, paired: dict) -> list[dict]:
    """Candidate vs champion on macro-F1 and each class's recall, paired on the shared pairs (`paired`: the champion
    rule's bootstrap), as `validation.gates.comparison_row` rows."""
    def by_id(rows):
        return {str(row["id"]): (str(row["expected"]), guess)
                for row, guess in zip(rows, score_predictions(rows).predicted, strict=True)}

    mine, theirs = by_id(candidate_rows), by_id(champion_rows)
    shared = sorted(mine.keys() & theirs.keys())
    truth = [mine[i][0] for i in shared]
    cand, champ = [mine[i][1] for i in shared], [theirs[i][1] for i in shared]
    rows = []
    if shared:
        f1 = paired_bootstrap(lambda idx: macro_f1([truth[i] for i in idx], [cand[i] for i in idx], LABELS),
                              lambda idx: macro_f1([truth[i] for i in idx], [champ[i] for i in idx], LABELS),
                              len(shared), **paired)
        rows.append(comparison_row("macro_f1", "higher", nli["macro_f1"], champion_nli["macro_f1"], f1))
    for label in LABELS:
        of_class = [i for i, t in enumerate(truth) if t == label]
        cand_hits = np.asarray([cand[i] == label for i in of_class], dtype=float)
        champ_hits = np.asarray([champ[i] == label for i in of_class], dtype=float)
        recall = None if not of_class else paired_bootstrap(partial(_mean_at, cand_hits),
                                                            partial(_mean_at, champ_hits), len(of_class), **paired)
        rows.append(comparison_row(f"recall_{label}", "higher", nli["per_class_recall"][label],
                                   champion_nli["per_class_recall"][label], recall))
    return [row for row in rows if row is not None]


def score_nli_targets(sides: Sequence[Side], datasets: Sequence[NliDataset], settings: RunSettings, *,
                      batch_size: int) -> list[tuple[list, dict, list]]:
    """Every dataset's pairs through each side, alternately in turns of whole batches when there are two
    (`validation.evaluate.side_by_side`); per side: predictions in pair order, the truncation report and every
    request's timing (`validation.nli.runner.RequestTiming`, numbered per dataset from 1 as one run numbers them)."""
    def score(target: Target, turn, requests: dict):
        run = run_pairs(target.invoker, turn.items, batch_size=batch_size, concurrency=settings.concurrency,
                        dataset_name=turn.dataset.name, **requests)
        first = turn.first // batch_size  # turns hold whole batches, so numbering goes on where the last turn ended
        return turn.dataset.name, replace(run, requests=[replace(r, id=f"{r.dataset}#{first + i}")
                                                         for i, r in enumerate(run.requests, start=1)])

    side_by_side(sides, turns_of(datasets, sides, TURN_PER_WORKER * settings.concurrency * batch_size), score,
                 lambda outcome: all(p.lost for p in outcome[1].predictions),
                 settings)
    scored = []
    for side in sides:
        runs: dict[str, list] = {}
        for name, run in side.outcomes:
            runs.setdefault(name, []).append(run)
        truncation = {name: NliRun(predictions=[],
                                   details=[d for run in parts for d in run.details]).truncation_summary()
                      for name, parts in runs.items()}
        scored.append(([p for _, run in side.outcomes for p in run.predictions], truncation,
                       [r for _, run in side.outcomes for r in run.requests]))
    return scored


def _request_rows(requests: Sequence) -> list[dict]:
    """Requests shaped as the metrics' rows, so that latency is summarised by the one definition
    (`validation.metrics.latency_summary`: first request apart, percentiles with intervals)."""
    return [{"id": r.id, "expected": "request", "option_ids": ["request"], "probabilities": None,
             "allowed_token_mass": None, "latency_ms": r.latency_ms, "retries_503": r.retries_503, "error": r.error,
             "started_at": r.started_at} for r in requests]


def request_metrics(pair_rows: Sequence[Mapping[str, Any]], requests: Sequence, *, n_bootstrap: int, seed: int,
                    confidence: float) -> dict:
    """The decision metrics of the pairs, with latency and throughput counted per request (one batch = one request):
    `latency_ms` over the requests, `latency_per_item_ms` the per-pair share (batch latency / its pairs) apart, and
    `throughput` answers (pairs) and requests per second over the span from the first request's start to the last
    one's end."""
    boot = {"n_bootstrap": n_bootstrap, "seed": seed, "confidence": confidence}
    metrics = decision_metrics(pair_rows, **boot)
    per_item = metrics["latency_ms"]
    per_request = latency_summary(_request_rows(requests), **boot)
    ok = [r for r in requests if r.error is None]
    seconds = (max(r.started_at + r.latency_ms / 1000 for r in ok) - min(r.started_at for r in ok)) if ok else 0.0
    answers = sum(r.pairs for r in ok)
    return {
        **metrics,
        "latency_ms": {**per_request, "counted_per": "request", "pairs_per_request": [r.pairs for r in requests]},
        "latency_per_item_ms": {**per_item, "counted_per": "pair (the batch's latency / its pairs)"},
        "throughput": {"answers": answers, "requests": len(ok), "seconds": seconds,
                       "answers_per_second": answers / seconds if seconds > 0 else None,
                       "requests_per_second": len(ok) / seconds if seconds > 0 else None},
    }


def evaluate_nli(
    candidate: Target,
    datasets: Sequence[NliDataset],
    out_dir: Path,
    *,
    thresholds: NliThresholds | None,
    champion_rule,
    champion: Target | None = None,
    settings: RunSettings = DEFAULT_SETTINGS,
    batch_size: int = 8,
    decision_rule: str = "bound",
    context: Callable[[dict], dict] | None = None,
    progress: Callable[[str], None] | None = None,
    title: str = "shiplift NLI gate",
    build_checks: Sequence[dict] = (),
) -> dict:
    """Score the candidate (and the champion on the same pairs, alternately in turns of whole batches), gate on
    decision + NLI metrics (the latency ratio paired over the requests), write reports;
    `thresholds` None (an ad-hoc evaluation) measures without judging; `context`, called with the measured metrics,
    returns `validation.evaluate.RELEASE_CONTEXT`; `build_checks` (validation.gates.Check fields) are checks the build
    judged, reported and decided with the gate's own."""
    if not datasets:
        raise BadInput("no NLI datasets to evaluate", fix="pass at least one dataset (e.g. the test split)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda message: None)
    boot = {"n_bootstrap": settings.n_bootstrap, "seed": settings.seed}
    for dataset in datasets:
        say(f"{dataset.name}: {len(dataset.pairs)} pairs, {dataset.dropped_unlabelled} unlabelled row(s) dropped")
    sides = [Side(target, progress_counter(say, target.label or role))
             for target, role in ((candidate, "candidate"), (champion, "champion")) if target is not None]
    (candidate_preds, candidate_truncation, candidate_requests), *champion_scored = score_nli_targets(
        sides, datasets, settings, batch_size=batch_size)
    write_predictions(out_dir / "predictions.jsonl", candidate_preds)
    candidate_rows = [p.to_dict() for p in candidate_preds]
    champion_rows = champion_truncation = champion_requests = None
    if champion_scored:
        champion_preds, champion_truncation, champion_requests = champion_scored[0]
        write_predictions(out_dir / "champion-predictions.jsonl", champion_preds)
        champion_rows = [p.to_dict() for p in champion_preds]
    confidence = (champion_rule or ChampionRule()).confidence
    candidate_metrics = request_metrics(candidate_rows, candidate_requests, **boot, confidence=confidence)
    shared = None if thresholds is None else {  # the thresholds the decision gate judges; all off is none of them
        "min_accuracy": thresholds.min_accuracy, "max_ece": thresholds.max_ece, "min_validity": thresholds.min_validity,
        "max_p95_latency_ms": thresholds.max_p95_latency_ms}
    decision_thresholds = DecisionThresholds(**shared) if shared and any(v is not None
                                                                         for v in shared.values()) else None
    latency_rows = None if champion_rows is None else (_request_rows(candidate_requests),
                                                       _request_rows(champion_requests))
    gate = evaluate_gates(
        candidate_rows, thresholds=decision_thresholds, champion_preds=champion_rows, champion_rule=champion_rule,
        candidate_metrics=candidate_metrics, decision_rule=decision_rule, latency_rows=latency_rows, **boot,
    )
    nli = nli_metrics(candidate_rows, **boot, confidence=gate.bootstrap["confidence"])
    nli_checks = []
    if thresholds is not None:
        nli_checks.append(absolute_check("macro_f1", nli["macro_f1"], thresholds.min_macro_f1, ">=", decision_rule))
        nli_checks += [
            absolute_check(f"recall_{label}", nli["per_class_recall"][label], thresholds.min_class_recall, ">=",
                           decision_rule)
            for label in LABELS
        ]
    checks = [check for check in (*gate.checks, *nli_checks) if check is not None]
    if thresholds is not None:
        checks += [Check.model_validate(check) for check in build_checks]
    champion_info = dict(gate.champion)
    if champion_rows is not None:
        champion_info["nli"] = nli_metrics(champion_rows, **boot, confidence=gate.bootstrap["confidence"])
        champion_info["metrics"] = request_metrics(champion_rows, champion_requests, **boot, confidence=confidence)
        paired = gate.bootstrap["champion_comparison"]
        p95 = latency_row(candidate_metrics["latency_ms"]["p95"], champion_info["metrics"]["latency_ms"]["p95"],
                          champion_info["p95_ratio"])  # per request, both sides, paired on the requests
        rows = [p95 if row["metric"] == "p95_latency_ms" else row for row in champion_info["comparison"]]
        champion_info["comparison"] = [*(row for row in rows if row is not None),
                                       *nli_comparison(candidate_rows, champion_rows, nli, champion_info["nli"],
                                                       paired)]
        mark_gated(champion_info["comparison"], checks)
    report = gate.model_copy(
        update={"checks": checks, "decision": decide(checks), "metrics": {**gate.metrics, "nli": nli},
                "champion": champion_info}
    ).to_dict()
    report["thresholds"] = None if thresholds is None else thresholds.model_dump(mode="json")
    truncation = {"candidate": candidate_truncation, "champion": champion_truncation}
    release = context(report["metrics"]) if context else None
    report = with_release_checks(report, release)  # the pipeline's own checks (a cold start) judged with the gate's
    extra = {
        "datasets": [d.evidence() for d in datasets],
        "candidate": candidate.describe(),
        "champion": None if champion is None else champion.describe(),
        "batch_size": batch_size,
        "latency_note": LATENCY_NOTE,
        "requests": [r.to_dict() for r in candidate_requests],
        "truncation": truncation,
        "release": release,
    }
    paths = write_reports(out_dir, gate_report=report, predictions=candidate_rows, title=title, parts=NLI_REPORT,
                          extra=extra)
    n_truncated = sum(t["n_truncated"] for t in candidate_truncation.values())
    say(f"{candidate.label or 'candidate'}: {n_truncated} of {len(candidate_rows)} pairs truncated by the server")
    return {
        **report, "paths": {k: str(v) for k, v in paths.items()}, "datasets": extra["datasets"],
        "truncation": truncation, "n_truncated": n_truncated,
    }
