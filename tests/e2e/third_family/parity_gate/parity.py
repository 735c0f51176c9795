"""The toy family's gate: each number of a JSONL dataset asked of the toy server, judged by the shared gates.

A dataset line is {"id", "x", "label": "even" | "odd", "split"}. Every answer becomes one prediction row in the shared
schema (`validation.metrics.REQUIRED_KEYS`), so the shared gates (`validation.gates`) judge it and the shared report
(`validation.gate_report`) shows it; only the request, the answer and the dataset are the family's own.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shiplift.validation.datasets import CheckedDataset
from shiplift.validation.gate_report import write_reports
from shiplift.validation.gates import evaluate_gates, with_release_checks
from shiplift.validation.report_parts import ReportParts

OPTIONS = ["even", "odd"]
DATASET = Path(__file__).with_name("numbers.jsonl")
TOY_REPORT = ReportParts(item="number", items="numbers", estimates=("accuracy", "validity", "ece"))


@dataclass(frozen=True, kw_only=True)
class NumberDataset(CheckedDataset):
    """The numbers of one dataset file, kept to its splits."""

    numbers: tuple[dict, ...]

    @property
    def items(self) -> tuple[dict, ...]:
        return self.numbers


def load_numbers(path: Path, *, name: str, splits: list[str] | None = None) -> NumberDataset:
    """Read a numbers file and keep the numbers of `splits` (all when None)."""
    data = Path(path).read_bytes()
    rows = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    kept = tuple(row for row in rows if not splits or row["split"] in splits)
    return NumberDataset(name=name, path=Path(path), sha256=hashlib.sha256(data).hexdigest(),
                         splits=tuple(splits) if splits else None, check={"status": "pass"}, numbers=kept)


def body(number: dict) -> bytes:
    """One request: the number to judge."""
    return json.dumps({"x": number["x"]}).encode("utf-8")


def score(invoker, numbers: tuple[dict, ...], *, dataset: str, timeout_s: float) -> list[dict]:
    """Ask each number in turn on one channel; one prediction row each (an unanswered one carries its error)."""
    channel, rows = invoker.open(), []
    try:
        for number in numbers:
            started = time.time()
            status, data = channel.post(body(number), timeout_s)
            answer = json.loads(data) if status == 200 else {}
            rows.append({
                "id": number["id"], "dataset": dataset, "expected": number["label"], "option_ids": OPTIONS,
                "probabilities": answer.get("probabilities"), "allowed_token_mass": None,
                "latency_ms": (time.time() - started) * 1000, "retries_503": 0, "started_at": started,
                "error": None if status == 200 else f"HTTP {status}: {data[:200]!r}",
                "model_sha256": answer.get("model_sha256")})
    finally:
        channel.close()
    return rows


def evaluate_parity(candidate, champion, datasets: list[NumberDataset], out_dir: Path, *, thresholds, champion_rule,
                    settings, title: str, decision_rule: str, context: Callable[[dict], dict] | None) -> dict[str, Any]:
    """Score the candidate (and the champion) on every number, gate with the shared gates, write the shared reports."""
    def rows_of(target) -> list[dict]:
        return [row for dataset in datasets
                for row in score(target.invoker, dataset.numbers, dataset=dataset.name, timeout_s=settings.timeout_s)]

    candidate_rows = rows_of(candidate)
    report = evaluate_gates(candidate_rows, thresholds=thresholds, champion_rule=champion_rule,
                            champion_preds=None if champion is None else rows_of(champion),
                            n_bootstrap=settings.n_bootstrap, seed=settings.seed, decision_rule=decision_rule).to_dict()
    release = context(report["metrics"]) if context else None
    report = with_release_checks(report, release)
    extra = {"datasets": [dataset.evidence() for dataset in datasets], "candidate": candidate.describe(),
             "champion": None if champion is None else champion.describe(), "release": release}
    paths = write_reports(out_dir, gate_report=report, predictions=candidate_rows, title=title, parts=TOY_REPORT,
                          extra=extra)
    return {**report, "paths": paths, "datasets": extra["datasets"]}
