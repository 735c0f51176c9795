"""What every family's gate shares: the targets it scores, the outcome it hands the pipeline, its run settings, and the
side-by-side scoring of a candidate and its champion.

A candidate and its champion are scored side by side (`side_by_side`): in alternate turns of a few items each, in one
window on one machine, so that their latencies can be compared (the gate's `champion_p95_ratio`) whatever else loads
the machine. The families' gates are in their packages (`validation.decisions.evaluate`, `validation.nli.evaluate`).
"""
from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from shiplift.validation.retry_policy import DEFAULT_RETRY_DEADLINE_S

RELEASE_CONTEXT = """What a pipeline tells the gate report about the release beside the measurements
(`extra.release`), all optional: release_id, champion_release, config_changes [{field, champion, candidate}] (the
config fields that differ from the champion's release), temperature {value, fitted} (the calibration the candidate
serves with), cost {candidate, production, per_million} (`tasks.backends.pricing` results as dicts, each with its
`text`)."""


@dataclass(frozen=True)
class Target:
    """A model to score: how to reach it (an invoker from the hosting backend) and what to call it."""

    invoker: Any  # tasks.backends.interfaces.Invoker
    label: str = ""
    # a champion's recorded per-task results the gate may reuse (`validation.champion_reuse.ChampionOffer`); None:
    # score it on every task
    offer: Any = None

    @classmethod
    def http(cls, url: str, component: str | None = None, label: str = "") -> Target:
        """A model-server root or a runtime-shaped router URL (`…/endpoints/NAME`, its errors unwrapped as on aws:
        `validation.transport.runtime_url`), plus its inference component."""
        # loading a config imports this module (GateOutcome); the HTTP client loads when a gate runs (test_boundaries)
        from shiplift.validation.transport import HttpInvoker  # noqa: PLC0415

        return cls(HttpInvoker(url, component), label)

    def describe(self) -> dict[str, Any]:
        """Where the answers came from, for the gate report."""
        return {**self.invoker.describe(), "label": self.label}


class GateOutcome(BaseModel):
    """What a model family's gate hands the validate stage: the decision, the checks and thresholds it judged, the
    metrics, the datasets it scored, and its report files (every .json, .jsonl and .html beside them is evidence)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: Literal["pass", "fail", "inconclusive", "not_gated"]
    checks: list[dict[str, Any]]
    thresholds: dict[str, Any] | None
    metrics: dict[str, Any]
    datasets: list[dict[str, Any]]
    gate_report_json: Path
    report_html: Path
    # whether the champion's per-task results were reused, from which release, or why it was scored
    # (`validation.champion_reuse.reused_rows`); None: no champion, or one the gate was offered nothing to reuse of
    champion_evidence: dict[str, Any] | None = None

    @classmethod
    def of(cls, report: dict[str, Any]) -> GateOutcome:
        """The outcome of a gate report as `evaluate_decisions` and `evaluate_nli` return it."""
        return cls(decision=report["decision"], checks=report["checks"], thresholds=report["thresholds"],
                   metrics=report["metrics"], datasets=report["datasets"],
                   gate_report_json=report["paths"]["gate_report_json"], report_html=report["paths"]["report_html"],
                   champion_evidence=(report.get("champion") or {}).get("evidence"))


@dataclass(frozen=True)
class RunSettings:
    """How an evaluation sends its requests: workers, one attempt's timeout, the whole run's deadline, how long
    retryable answers (no capacity, throttling) are retried while the endpoint answers nothing, and the statistics."""

    concurrency: int = 2
    timeout_s: float = 120.0
    deadline_s: float = 3600.0
    n_bootstrap: int = 1000
    seed: int = 0
    readout: Any = None  # validation.runner.Readout; None: SemIf's
    retry_deadline_s: float = DEFAULT_RETRY_DEADLINE_S

    def requests(self, notice: Callable[[str], None] | None = None) -> dict[str, Any]:
        """The runners' request settings (`validation.transport.RequestSettings`) these settings give."""
        return {"timeout_s": self.timeout_s, "deadline_s": self.deadline_s, "retry_deadline_s": self.retry_deadline_s,
                "notice": notice}


DEFAULT_SETTINGS = RunSettings()  # frozen, so one instance serves every call's default
TURN_PER_WORKER = 2  # requests each worker sends in one target's turn of a side-by-side run


@dataclass
class Side:
    """One target of a side-by-side run, and what its turns gave: the runner's outcome of each turn, in order."""

    target: Target
    progress: Callable[[int, int], None] | None  # counts the whole run's items (`progress_counter`)
    done: int = 0
    last_answer: float | None = None  # time.monotonic() of its last turn that got an answer
    outcomes: list = field(default_factory=list)


@dataclass(frozen=True)
class Turn:
    """Consecutive items of one dataset that every side scores in its turn; `first`: the first one's index in it."""

    dataset: Any  # a checked dataset (validation.datasets.CheckedDataset)
    first: int
    items: Sequence[Any]


def turns_of(datasets: Sequence[Any], sides: Sequence[Side], size: int) -> list[Turn]:
    """Each dataset's items cut into turns of `size` when sides alternate (a turn never spans two datasets); a side
    alone scores each dataset in one turn."""
    size = size if len(sides) > 1 else max([len(d.items) for d in datasets] + [1])
    return [Turn(dataset, first, dataset.items[first:first + size])
            for dataset in datasets for first in range(0, len(dataset.items), size)]


def side_by_side(sides: Sequence[Side], turns: Sequence[Turn], score: Callable[[Target, Turn, dict], Any],
                 lost: Callable[[Any], bool], settings: RunSettings,
                 notice: Callable[[str], None] | None = None, *, first_only: frozenset[int] = frozenset()) -> None:
    """Score the turns on every side alternately: side A's turn, then B's on the same items, then B first on the next
    turn (A B B A ...), so that a candidate and its champion are measured in one window on one machine (what loads
    the machine loads both) and neither always runs right after the other. Each side keeps the gate's concurrency in
    its turn. `score(target, turn, requests)` runs one turn (`requests`: the runner's request settings, with the run's
    deadline and the side's retry deadline as much of them as is left, and progress counted over the whole run);
    `lost(outcome)`: that turn got no answer at all (the retry deadline then keeps counting from the side's last
    answer, so an endpoint that never answers is given up once, not once a turn). The turns numbered in `first_only`
    are scored by the first side alone (a champion whose recorded results are reused answers only the others)."""
    start = time.monotonic()
    totals = [sum(len(turn.items) for number, turn in enumerate(turns) if not rank or number not in first_only)
              for rank in range(len(sides))]
    paired = 0
    for number, turn in enumerate(turns):
        order = list(zip(sides, totals, strict=True))
        if number in first_only:
            order = order[:1]
        else:
            order = order if paired % 2 == 0 else order[::-1]
            paired += 1
        for side, total in order:
            now = time.monotonic()
            retry = settings.retry_deadline_s
            if retry is not None:
                retry = max(retry - (now - (side.last_answer or start)), 1e-3)
            progress = None if side.progress is None else functools.partial(_counted, side, total)
            requests = {**settings.requests(notice), "deadline_s": max(settings.deadline_s - (now - start), 1e-3),
                        "retry_deadline_s": retry, "progress": progress}
            outcome = score(side.target, turn, requests)
            side.done += len(turn.items)
            side.last_answer = side.last_answer if lost(outcome) else time.monotonic()
            side.outcomes.append(outcome)


def _counted(side: Side, total: int, done: int, _of: int) -> None:
    side.progress(side.done + done, total)


def lost_requests(out_dir: Path, unit: str) -> str | None:
    """What an evaluation written to `out_dir` lost (its predictions files' items that got no answer: refused as
    retryable until the retry deadline, unreachable, or cut by the run's deadline), or None when it lost nothing."""
    # loading a config imports this module (GateOutcome); the runner loads when a gate has run (test_boundaries)
    from shiplift.validation.runner import read_predictions  # noqa: PLC0415

    parts, reasons = [], Counter()
    for role, name in (("candidate", "predictions.jsonl"), ("champion", "champion-predictions.jsonl")):
        path = Path(out_dir) / name
        if not path.is_file():
            continue
        predictions = read_predictions(path)
        lost = [p for p in predictions if p.lost]
        if lost:
            parts.append(f"{len(lost)} of {len(predictions)} {role} {unit}")
            reasons.update(p.error for p in lost)
    if not parts:
        return None
    (reason, count), = reasons.most_common(1)
    return f"{' and '.join(parts)} got no answer (lost); {count} of them: {reason}"


def time_left(seconds: float) -> str:
    """A remaining time for people: `45s`, `3m 05s`, `1h 12m`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def progress_counter(say: Callable[[str], None], label: str, *,
                     clock: Callable[[], float] | None = None) -> Callable[[int, int], None]:
    """A runner progress callback that reports about five times per run, with the time left at the rate so far
    (`candidate: 40/111 tasks, ~1m 12s left`)."""
    clock = clock or time.monotonic
    step = {"next": 0, "started": clock()}

    def report(done: int, total: int) -> None:
        if done >= step["next"] or done == total:
            elapsed = clock() - step["started"]
            left = f", ~{time_left(elapsed / done * (total - done))} left" if 0 < done < total and elapsed > 0 else ""
            say(f"{label}: {done}/{total} tasks{left}")
            step["next"] = done + max(1, total // 5)

    return report
