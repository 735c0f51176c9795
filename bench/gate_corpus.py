"""Seeded gate candidates whose truth is known, built from recorded per-task outcomes of real models and of the tiny
model the tests make (issue 45 item 3).

The base is a model's prediction rows (`validation.runner` predictions.jsonl lines, `bench/record_gate_outcomes.py`):
Gemma-3-270M (`gemma`) or the tests' tiny generated GGUF (`tiny`, a random model), recorded twice, alternately task
by task: pass `a` plays the champion, pass `b` (the same model, so the same answers and the machine's own latency
noise) is the start of every candidate. The tasks a base recorded are the population:
a gate's n tasks are drawn from its main pool with replacement, an extension's from its reserve (JevBench).

A candidate (`Spec`) changes pass b in ways whose effect on the population is known exactly:
- flips: a task the champion answers right is made wrong with probability `a`, a wrong one right with probability `b`,
  chosen per pool so that E[disagreement] = q and E[candidate − champion accuracy] = −shortfall (a flip swaps two
  options' probabilities, so the confidence is kept: only correctness moves);
- temperature: probabilities become softmax(log p / T) (the argmax, so accuracy, is kept; the calibration moves);
- latency: each answer's latency times `latency_ratio` (pass b's first scaled to the champion's p95 on the pool).
`truth` gives each candidate's population accuracy shortfall, ECE difference and p95 ratio (the ECE one computed
from every task's expected correctness, the limit of a large resample).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from shiplift.tasks.errors import BadInput, NotFound
from shiplift.validation.metrics import N_BINS, bin_index, score_predictions

DATA = Path(__file__).resolve().parent / "data" / "gate-corpus"
# --base name: the recorded files' stem (gemma: the demo model; tiny: the generated model the tests' releases serve)
BASES = {"gemma": "gemma3-270m-q4km", "tiny": "tiny-seed3"}
MAIN, RESERVE = "decisions", "jevbench"  # the datasets the recording names: the gate's tasks, the extension's


def softmax_tempered(probabilities: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(log p / T) of one task's option probabilities (T > 1 flattens, T < 1 sharpens; the argmax is kept)."""
    logits = np.log(np.clip(probabilities, 1e-300, None)) / temperature
    logits -= logits.max()
    weights = np.exp(logits)
    return weights / weights.sum()


@dataclass(frozen=True)
class Pool:
    """A dataset's recorded tasks of a base: the champion's rows (pass a), the re-run's (pass b), valid rows only."""

    name: str
    rows_a: list[dict]
    rows_b: list[dict]

    @cached_property
    def correct(self) -> np.ndarray:
        """The champion's correctness per task."""
        return score_predictions(self.rows_a).correct

    @property
    def size(self) -> int:
        return len(self.rows_a)

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean())

    @cached_property
    def log_probabilities(self) -> np.ndarray:
        """(tasks, most options) log p of pass a, −inf where a task has fewer options."""
        widest = max(len(row["probabilities"]) for row in self.rows_a)
        logs = np.full((self.size, widest), -np.inf)
        for i, row in enumerate(self.rows_a):
            logs[i, :len(row["probabilities"])] = np.log(np.clip(row["probabilities"], 1e-300, None))
        return logs

    def confidence(self, temperature: float) -> np.ndarray:
        """Top-label confidence per task at `temperature`, `softmax_tempered`'s max for every task at once (a flip
        keeps it: it swaps two options' probabilities); at T = 1 the recorded top probability as it is."""
        if temperature == 1.0:
            return np.array([max(row["probabilities"]) for row in self.rows_a], dtype=float)
        logits = self.log_probabilities / temperature
        weights = np.exp(logits - logits.max(axis=1, keepdims=True))
        return 1.0 / weights.sum(axis=1)

    @cached_property
    def latency_scale(self) -> float:
        """p95 of pass a over p95 of pass b on the pool: pass b's latencies times this have the champion's p95, so a
        candidate's `latency_ratio` is its true p95 ratio."""
        return float(np.percentile(self.latency_a, 95) / np.percentile(self.latency_b, 95))

    @cached_property
    def latency_a(self) -> np.ndarray:
        return np.array([row["latency_ms"] for row in self.rows_a], dtype=float)

    @cached_property
    def latency_b(self) -> np.ndarray:
        return np.array([row["latency_ms"] for row in self.rows_b], dtype=float)

    def flip_rates(self, disagreement: float, shortfall: float) -> tuple[float, float]:
        """(right → wrong, wrong → right) flip probabilities for E[disagreement] = q, E[difference] = −shortfall."""
        p = self.accuracy
        worse, better = (disagreement + shortfall) / 2.0, (disagreement - shortfall) / 2.0
        if better < -1e-12 or worse > p or better > 1.0 - p:
            raise BadInput(f"pool {self.name} (champion accuracy {p:.3f}) cannot give disagreement {disagreement:g} "
                           f"with shortfall {shortfall:g}",
                           fix="use a disagreement at least the shortfall and within the champion's right and "
                               "wrong shares")
        return worse / p, max(better, 0.0) / (1.0 - p)


@dataclass(frozen=True)
class Base:
    """A recorded base model: its main pool (the gate's tasks) and its reserve (the extension's), and where from."""

    name: str
    main: Pool
    reserve: Pool
    provenance: dict = field(default_factory=dict)


def _read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise NotFound(f"recorded outcomes {path} are missing",
                       fix="run `.venv/bin/python -m bench.record_gate_outcomes` (see bench/README.md)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_base(name: str = "gemma", data: Path = DATA) -> Base:
    """A recorded base (`BASES`): rows of pass a and b, paired by id, invalid rows (no probabilities) left out."""
    if name not in BASES:
        raise BadInput(f"unknown base {name!r}", fix=f"use one of {sorted(BASES)}")
    stem = BASES[name]
    rows_a, rows_b = _read_rows(data / f"{stem}.a.jsonl"), _read_rows(data / f"{stem}.b.jsonl")
    if [r["id"] for r in rows_a] != [r["id"] for r in rows_b]:
        raise BadInput(f"{stem}: passes a and b do not hold the same tasks in the same order",
                       fix="re-record with bench.record_gate_outcomes")
    valid = score_predictions(rows_a).valid & score_predictions(rows_b).valid
    pools = {}
    for dataset in (MAIN, RESERVE):
        keep = [i for i, row in enumerate(rows_a) if row["dataset"] == dataset and valid[i]]
        pools[dataset] = Pool(dataset, [rows_a[i] for i in keep], [rows_b[i] for i in keep])
    provenance_path = data / f"{stem}.provenance.json"
    provenance = json.loads(provenance_path.read_text(encoding="utf-8")) if provenance_path.is_file() else {}
    return Base(name, pools[MAIN], pools[RESERVE], provenance)


@dataclass(frozen=True)
class Spec:
    """One kind of seeded candidate: `disagreement` q and accuracy `shortfall` δ (flips), `temperature`,
    latency ratio."""

    label: str
    disagreement: float = 0.0
    shortfall: float = 0.0
    temperature: float = 1.0
    latency_ratio: float = 1.0


@dataclass(frozen=True)
class Truth:
    """A candidate's population differences from the champion: accuracy shortfall, ECE difference, p95 ratio."""

    shortfall: float
    ece_difference: float
    p95_ratio: float


def population_ece(confidence: np.ndarray, expected_correct: np.ndarray) -> float:
    """ECE of a population whose task i has confidence c_i and is right with probability r_i: the metric's own bins,
    with each bin's accuracy the mean of r (what a resample's ECE tends to as it grows)."""
    bins = bin_index(confidence)
    gap = np.bincount(bins, weights=expected_correct, minlength=N_BINS) - np.bincount(bins, weights=confidence,
                                                                                        minlength=N_BINS)
    return float(np.abs(gap).sum() / confidence.size)


def truth(pool: Pool, spec: Spec) -> Truth:
    """`spec`'s population differences on `pool` (the gate's tasks are drawn from it)."""
    worse, better = pool.flip_rates(spec.disagreement, spec.shortfall)
    right = pool.correct.astype(float)
    expected = right * (1.0 - worse) + (1.0 - right) * better
    champion_ece = population_ece(pool.confidence(1.0), right)
    candidate_ece = population_ece(pool.confidence(spec.temperature), expected)
    p95_b, p95_a = np.percentile(pool.latency_b, 95), np.percentile(pool.latency_a, 95)
    p95 = spec.latency_ratio * pool.latency_scale * p95_b / p95_a
    return Truth(shortfall=float(right.mean() - expected.mean()), ece_difference=candidate_ece - champion_ece,
                 p95_ratio=float(p95))


def temperature_for(pool: Pool, ece_increase: float) -> float:
    """The temperature nearest 1 (in log T) whose candidate's population ECE exceeds the champion's by
    `ece_increase`."""

    def target(temperature: float) -> float:
        return truth(pool, Spec("t", temperature=temperature)).ece_difference - ece_increase

    grid = np.exp(np.linspace(-math.log(20.0), math.log(20.0), 401))
    values = np.array([target(t) for t in grid])
    hits = [i for i in range(len(grid)) if values[i] >= 0]
    if not hits:
        raise BadInput(f"no temperature in [1/20, 20] raises {pool.name}'s ECE by {ece_increase:g}",
                       fix="ask for a smaller ECE increase")
    i = min(hits, key=lambda k: abs(math.log(grid[k])))
    j = i + 1 if grid[i] < 1.0 else i - 1  # the grid neighbour toward 1, below the target
    low, high = sorted((grid[i], grid[j]))
    for _ in range(40):  # bisection between the neighbour (below target) and the hit (at or above)
        middle = math.sqrt(low * high)
        if (target(middle) >= 0) == (grid[i] == high):
            high = middle
        else:
            low = middle
    return high if grid[i] >= 1.0 else low


@dataclass(frozen=True)
class Draws:
    """K candidates of one spec against the champion on n tasks drawn from a pool: task positions and flips, and the
    arrays the gate's champion checks read (in draw order, which is also the order of the rows' ids)."""

    pool: Pool
    spec: Spec
    tasks: np.ndarray  # (K, n) positions in the pool
    flipped: np.ndarray  # (K, n) bool

    @property
    def champion_correct(self) -> np.ndarray:
        return self.pool.correct[self.tasks]

    @property
    def candidate_correct(self) -> np.ndarray:
        return self.champion_correct ^ self.flipped

    @property
    def champion_confidence(self) -> np.ndarray:
        return self.pool.confidence(1.0)[self.tasks]

    @property
    def candidate_confidence(self) -> np.ndarray:
        return self.pool.confidence(self.spec.temperature)[self.tasks]

    def rows(self, k: int) -> tuple[list[dict], list[dict]]:
        """Candidate k's and the champion's prediction rows, as the runner writes them (ids `tNNNNN-<task id>`)."""
        candidate, champion = [], []
        for j, (task, flip) in enumerate(zip(self.tasks[k], self.flipped[k], strict=True)):
            ident = f"t{j:05d}-{self.pool.rows_a[task]['id']}"
            champion.append({**self.pool.rows_a[task], "id": ident})
            candidate.append(candidate_row(self.pool.rows_b[task], ident, flip=bool(flip), spec=self.spec,
                                           latency_scale=self.pool.latency_scale))
        return candidate, champion


def candidate_row(row: Mapping[str, Any], ident: str, *, flip: bool, spec: Spec, latency_scale: float = 1.0) -> dict:
    """Pass b's row of one task made into the candidate's: flipped (the expected option's probability swapped with
    the predicted one's, or with the strongest other option's when it was right), tempered, its latency scaled."""
    probs = np.asarray(row["probabilities"], dtype=float)
    logits = list(row["option_logits"]) if row.get("option_logits") else None
    if flip:
        options = row["option_ids"]
        truth_at = options.index(row["expected"])
        top = int(np.argmax(probs))
        other = top if top != truth_at else int(np.argsort(probs)[-2])
        swap = [truth_at, other]
        probs[swap] = probs[swap[::-1]]
        if logits is not None:
            logits[truth_at], logits[other] = logits[other], logits[truth_at]
    if spec.temperature != 1.0:
        probs = softmax_tempered(probs, spec.temperature)
        logits = None if logits is None else [x / spec.temperature for x in logits]
    return {**row, "id": ident, "probabilities": [float(p) for p in probs], "option_logits": logits,
            "latency_ms": float(row["latency_ms"]) * spec.latency_ratio * latency_scale}


def draw(pool: Pool, spec: Spec, *, candidates: int, n: int, rng: np.random.Generator) -> Draws:
    """`candidates` independent gates of `n` tasks each, drawn from `pool` with replacement, flipped per `spec`."""
    worse, better = pool.flip_rates(spec.disagreement, spec.shortfall)
    tasks = rng.integers(0, pool.size, size=(candidates, n))
    chance = np.where(pool.correct[tasks], worse, better)
    return Draws(pool, spec, tasks, rng.random((candidates, n)) < chance)


def standard_specs(margin: float, *, ece_margin: float | None, pool: Pool, max_p95_ratio: float | None,
                   disagreements: Sequence[float] = (0.03, 0.08, 0.15), worse_disagreement: float = 0.08) -> list[Spec]:
    """The corpus for one config: equal candidates at each disagreement; worse by the margin and twice it; with an ECE
    check, calibration skews raising the ECE by its margin and twice it; with a p95 ratio check, an equal latency and
    ratios at the limit and twice as far past 1 (all judged against their own truth, `truth`)."""
    specs = [Spec(f"equal, {q:.0%} disagree", disagreement=q) for q in disagreements]
    specs += [Spec(f"accuracy -{times * margin:g}, {max(worse_disagreement, times * margin):.0%} disagree",
                   disagreement=max(worse_disagreement, times * margin), shortfall=times * margin)
              for times in (1, 2)]
    if ece_margin is not None:
        specs += [Spec(f"ECE +{times * ece_margin:g} (T={t:.3g})", temperature=t)
                  for times in (1, 2) for t in [temperature_for(pool, times * ece_margin)]]
    if max_p95_ratio is not None:
        specs += [Spec(f"p95 x{ratio:.3g}", latency_ratio=ratio)
                  for ratio in (1.0, max_p95_ratio, 1.0 + 2.0 * (max_p95_ratio - 1.0))]
    return specs
