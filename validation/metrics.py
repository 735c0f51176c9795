"""Decision metrics, defined once (DESIGN §8.2): accuracy, validity, calibration, latency, bootstrap.

Input rows are the runner's predictions.jsonl dicts. A row with an error, or with probabilities
that are missing or invalid, is *invalid*: it counts as wrong for accuracy and is left out of the
calibration metrics (ECE, Brier, NLL, reliability), which are computed on the valid rows only and
carry their own sample size. 503 retries are infrastructure noise: a row that eventually
succeeded is judged on its answer alone; retries are counted and reported, never scored.

Conventions:
- accuracy: argmax of the probabilities; ties go to the lexicographically smallest tied label;
- validity: probabilities present for every option, all finite, each in [0, 1], sum within 2 %;
- ECE: top-label confidence (max probability), 10 equal-width bins (0, 0.1], …, (0.9, 1.0]
  (a confidence of exactly 0 falls in the first bin), |accuracy − mean confidence| weighted by
  the bin's share of rows;
- Brier: mean over rows of Σ_k (p_k − y_k)² (the multi-class form: twice the binary form);
- NLL: mean of −log p_true, with p_true clipped below at 1e-12 so a zero probability on the
  true label costs 27.6 nats instead of infinity;
- intervals: percentile bootstrap (default 1000 resamples, 95 %, seeded), resampling rows; the paired accuracy
  difference alone takes Tango's score interval for paired proportions (see "Paired proportions").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from statistics import NormalDist
from typing import Any

import numpy as np

from shiplift.tasks.errors import BadInput

N_BINS = 10
SUM_TOLERANCE = 0.02
NLL_CLIP = 1e-12
DEFAULT_CONFIDENCE = 0.95
DEFAULT_BOOTSTRAP = 1000
LATENCY_PERCENTILES = (50, 90, 95, 99)
REQUIRED_KEYS = (
    "id",
    "expected",
    "option_ids",
    "probabilities",
    "allowed_token_mass",
    "latency_ms",
    "retries_503",
    "error",
    "started_at",
)


# --------------------------------------------------------------------------------------------
# Rows


def probabilities_valid(probabilities: Any, n_options: int) -> bool:
    """True when there is one finite probability in [0, 1] per option and they sum to 1 ± 2 %."""
    if not isinstance(probabilities, Sequence | np.ndarray) or isinstance(probabilities, str):
        return False
    if len(probabilities) != n_options or n_options == 0:
        return False
    if any(isinstance(p, bool) or not isinstance(p, int | float | np.floating) for p in probabilities):
        return False
    values = np.asarray(probabilities, dtype=float)
    if not np.all(np.isfinite(values)) or np.any(values < 0.0) or np.any(values > 1.0):
        return False
    return abs(float(values.sum()) - 1.0) <= SUM_TOLERANCE


def predict_label(option_ids: Sequence[str], probabilities: Sequence[float]) -> str:
    """The argmax label; ties go to the lexicographically smallest tied label (one fixed rule)."""
    values = np.asarray(probabilities, dtype=float)
    tied = np.flatnonzero(values == values.max())
    return min(option_ids[i] for i in tied)


@dataclass(frozen=True)
class ScoredPredictions:
    """Per-row arrays derived once from prediction rows; every metric reads these."""

    ids: list[str]
    valid: np.ndarray  # bool, per row
    correct: np.ndarray  # bool, per row (invalid rows are wrong)
    predicted: list[str | None]  # None for invalid rows
    confidence: np.ndarray  # max probability; nan for invalid rows
    p_true: np.ndarray  # probability of the expected label; nan for invalid rows
    brier: np.ndarray  # Σ_k (p_k − y_k)²; nan for invalid rows
    allowed_token_mass: np.ndarray  # nan where not reported
    errors: int
    retries_503: int

    @property
    def n(self) -> int:
        return len(self.ids)


def _row_error(index: int, row: Mapping[str, Any], problem: str) -> BadInput:
    ident = row.get("id") if isinstance(row, Mapping) else None
    return BadInput(
        f"prediction row {index} (id={ident!r}): {problem}",
        fix="write predictions with the runner's predictions.jsonl schema (id, expected, option_ids, "
        "probabilities, allowed_token_mass, latency_ms, retries_503, error, started_at, …)",
    )


def _check_row(index: int, row: Any) -> None:
    if not isinstance(row, Mapping):
        raise _row_error(index, {}, f"expected a JSON object, got {type(row).__name__}")
    missing = [key for key in REQUIRED_KEYS if key not in row]
    if missing:
        raise _row_error(index, row, f"missing keys {missing}")
    if not isinstance(row["id"], str) or not row["id"]:
        raise _row_error(index, row, "id must be a non-empty string")
    options = row["option_ids"]
    if not isinstance(options, list) or not options or not all(isinstance(o, str) for o in options):
        raise _row_error(index, row, "option_ids must be a non-empty list of strings")
    if len(set(options)) != len(options):
        raise _row_error(index, row, f"option_ids has duplicates: {options}")
    if not isinstance(row["expected"], str) or row["expected"] not in options:
        raise _row_error(index, row, f"expected {row['expected']!r} is not one of option_ids {options}")
    if row["error"] is not None and not isinstance(row["error"], str):
        raise _row_error(index, row, "error must be a string or null")
    retries = row["retries_503"]
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise _row_error(index, row, f"retries_503 must be a non-negative integer, got {retries!r}")
    mass = row["allowed_token_mass"]
    if mass is not None and (isinstance(mass, bool) or not isinstance(mass, int | float)):
        raise _row_error(index, row, f"allowed_token_mass must be a number or null, got {mass!r}")


def score_predictions(predictions: Sequence[Mapping[str, Any]]) -> ScoredPredictions:
    """Check prediction rows and derive the per-row arrays every metric is computed from."""
    if not predictions:
        raise BadInput("no predictions to score", fix="run the validation set against the candidate first")
    seen: set[str] = set()
    ids: list[str] = []
    valid, correct, confidence, p_true, brier, mass = [], [], [], [], [], []
    predicted: list[str | None] = []
    errors = retries = 0
    for index, row in enumerate(predictions):
        _check_row(index, row)
        if row["id"] in seen:
            raise _row_error(index, row, "duplicate id (each task must appear once)")
        seen.add(row["id"])
        ids.append(row["id"])
        options = row["option_ids"]
        errors += row["error"] is not None
        retries += row["retries_503"]
        reported_mass = row["allowed_token_mass"]
        mass.append(float(reported_mass) if reported_mass is not None else math.nan)
        ok = row["error"] is None and probabilities_valid(row["probabilities"], len(options))
        valid.append(ok)
        if not ok:
            correct.append(False)
            predicted.append(None)
            confidence.append(math.nan)
            p_true.append(math.nan)
            brier.append(math.nan)
            continue
        probs = np.asarray(row["probabilities"], dtype=float)
        true_index = options.index(row["expected"])
        label = predict_label(options, probs)
        predicted.append(label)
        correct.append(label == row["expected"])
        confidence.append(float(probs.max()))
        p_true.append(float(probs[true_index]))
        brier.append(float(brier_terms([probs], [true_index])[0]))
    return ScoredPredictions(
        ids=ids,
        valid=np.asarray(valid, dtype=bool),
        correct=np.asarray(correct, dtype=bool),
        predicted=predicted,
        confidence=np.asarray(confidence, dtype=float),
        p_true=np.asarray(p_true, dtype=float),
        brier=np.asarray(brier, dtype=float),
        allowed_token_mass=np.asarray(mass, dtype=float),
        errors=errors,
        retries_503=retries,
    )


# --------------------------------------------------------------------------------------------
# Metric definitions


def accuracy(predictions: Sequence[Mapping[str, Any]]) -> float:
    """Share of rows whose argmax label is the expected one (invalid rows count as wrong)."""
    return float(score_predictions(predictions).correct.mean())


def validity(predictions: Sequence[Mapping[str, Any]]) -> float:
    """Share of rows without error whose probabilities pass `probabilities_valid`."""
    return float(score_predictions(predictions).valid.mean())


def brier_terms(probabilities: Sequence[Sequence[float]], true_index: Sequence[int]) -> np.ndarray:
    """Per-row multi-class Brier terms Σ_k (p_k − y_k)² (rows may have different option counts)."""
    terms = []
    for probs, truth in zip(probabilities, true_index, strict=True):
        values = np.asarray(probs, dtype=float)
        onehot = np.zeros_like(values)
        onehot[truth] = 1.0
        terms.append(float(np.sum((values - onehot) ** 2)))
    return np.asarray(terms, dtype=float)


def multiclass_brier(probabilities: Sequence[Sequence[float]], true_index: Sequence[int]) -> float:
    """Mean over rows of Σ_k (p_k − y_k)² (for two options: twice the binary Brier score)."""
    return float(brier_terms(probabilities, true_index).mean())


def nll_terms(p_true: np.ndarray) -> np.ndarray:
    """Per-row −log p_true with p_true clipped below at 1e-12 (a zero costs 27.6 nats, not ∞)."""
    return -np.log(np.clip(np.asarray(p_true, dtype=float), NLL_CLIP, 1.0))


def negative_log_likelihood(probabilities: Sequence[Sequence[float]], true_index: Sequence[int]) -> float:
    """Mean −log p_true over rows, p_true clipped below at 1e-12."""
    p_true = [float(probs[truth]) for probs, truth in zip(probabilities, true_index, strict=True)]
    return float(nll_terms(np.asarray(p_true)).mean())


def bin_index(confidence: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Equal-width, right-closed bin of each confidence: (0, 1/n] → 0, …, ((n−1)/n, 1] → n−1."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    return np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, n_bins - 1)


def reliability_table(confidence: np.ndarray, correct: np.ndarray, n_bins: int = N_BINS) -> list[dict]:
    """Per bin: edges, row count, mean confidence and accuracy (None for an empty bin)."""
    confidence = np.asarray(confidence, dtype=float)
    correct = np.asarray(correct, dtype=float)
    bins = bin_index(confidence, n_bins)
    table = []
    for b in range(n_bins):
        members = bins == b
        count = int(members.sum())
        table.append(
            {
                "bin": b,
                "lower": b / n_bins,
                "upper": (b + 1) / n_bins,
                "count": count,
                "mean_confidence": float(confidence[members].mean()) if count else None,
                "accuracy": float(correct[members].mean()) if count else None,
            }
        )
    return table


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, n_bins: int = N_BINS) -> float:
    """Top-label ECE: Σ_bins (count/n)·|accuracy − mean confidence| over equal-width bins."""
    confidence = np.asarray(confidence, dtype=float)
    correct = np.asarray(correct, dtype=float)
    if confidence.size == 0:
        raise BadInput("ECE of zero rows is undefined", fix="score at least one valid prediction")
    bins = bin_index(confidence, n_bins)
    conf_sum = np.bincount(bins, weights=confidence, minlength=n_bins)
    correct_sum = np.bincount(bins, weights=correct, minlength=n_bins)
    return float(np.abs(correct_sum - conf_sum).sum() / confidence.size)


def confusion_counts(
    y_true: Sequence[str], y_pred: Sequence[str | None], labels: Sequence[str]
) -> dict[str, dict[str, int]]:
    """Per label: true positives, false positives, false negatives (None predictions are misses)."""
    if len(y_true) != len(y_pred):
        raise BadInput(
            f"y_true has {len(y_true)} labels but y_pred has {len(y_pred)}", fix="pass one prediction per row"
        )
    counts = {label: {"tp": 0, "fp": 0, "fn": 0} for label in labels}
    for truth, guess in zip(y_true, y_pred, strict=True):
        if truth == guess:
            if truth in counts:
                counts[truth]["tp"] += 1
            continue
        if truth in counts:
            counts[truth]["fn"] += 1
        if guess in counts:
            counts[guess]["fp"] += 1
    return counts


def per_class_recall(
    y_true: Sequence[str], y_pred: Sequence[str | None], labels: Sequence[str]
) -> dict[str, float | None]:
    """Recall tp/(tp+fn) per label; None for a label with no true rows (undefined, not zero)."""
    counts = confusion_counts(y_true, y_pred, labels)
    return {
        label: (c["tp"] / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] else None) for label, c in counts.items()
    }


def macro_f1(y_true: Sequence[str], y_pred: Sequence[str | None], labels: Sequence[str]) -> float:
    """Unweighted mean over `labels` of F1 = 2tp/(2tp+fp+fn), 0 for a label never seen nor predicted."""
    if not labels:
        raise BadInput("macro-F1 needs at least one label", fix="pass the label set")
    counts = confusion_counts(y_true, y_pred, labels)
    scores = [
        2 * c["tp"] / (2 * c["tp"] + c["fp"] + c["fn"]) if (2 * c["tp"] + c["fp"] + c["fn"]) else 0.0
        for c in counts.values()
    ]
    return float(np.mean(scores))


# --------------------------------------------------------------------------------------------
# Bootstrap
#
# Percentile intervals, kept over scipy.stats.bootstrap(method="BCa"): BCa's interval is NaN (DegenerateDataWarning)
# when every resample gives one value, as when a candidate answers exactly as its champion does; and the gate's
# measured error rates for ECE (bench/gate_error_rates.py draws these same seeded resamples) hold for this interval.
# Statistics take row indices, so ECE and macro-F1 resample whole rows as accuracy does. The champion accuracy check
# does not bootstrap: it takes the score interval below ("Paired proportions").


def bootstrap_ci(
    statistic: Callable[[np.ndarray], float],
    n: int,
    *,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> list[float] | None:
    """Percentile-bootstrap interval of `statistic(indices)` over `n` rows resampled with replacement."""
    _check_bootstrap_args(n_bootstrap, confidence)
    if n == 0:
        return None
    rng = np.random.default_rng(seed)
    samples = np.array([statistic(rng.integers(0, n, size=n)) for _ in range(n_bootstrap)], dtype=float)
    return _percentile_interval(samples, confidence)


def paired_bootstrap(
    candidate: Callable[[np.ndarray], float],
    champion: Callable[[np.ndarray], float],
    n: int,
    *,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict:
    """Point value and percentile interval of candidate − champion, both resampled on the SAME rows."""
    _check_bootstrap_args(n_bootstrap, confidence)
    if n == 0:
        raise BadInput("no shared rows for a paired comparison", fix="score both models on the same task ids")
    everything = np.arange(n)
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n_bootstrap):
        idx = rng.integers(0, n, size=n)
        samples.append(candidate(idx) - champion(idx))
    return {
        "n": n,
        "candidate": float(candidate(everything)),
        "champion": float(champion(everything)),
        "difference": float(candidate(everything) - champion(everything)),
        "ci": _percentile_interval(np.asarray(samples, dtype=float), confidence),
    }


def _check_bootstrap_args(n_bootstrap: int, confidence: float) -> None:
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int) or n_bootstrap < 1:
        raise BadInput(f"n_bootstrap must be a positive integer, got {n_bootstrap!r}", fix="use e.g. 1000")
    if not 0.0 < confidence < 1.0:
        raise BadInput(f"confidence must be in (0, 1), got {confidence!r}", fix="use e.g. 0.95")


def _percentile_interval(samples: np.ndarray, confidence: float) -> list[float]:
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return [float(low), float(high)]


def _estimate(
    values: np.ndarray, statistic: Callable[[np.ndarray], float], *, n_bootstrap: int, seed: int, confidence: float
) -> dict:
    """{"value", "ci", "n"} of statistic over `values` (None value and ci when there are no rows)."""
    n = len(values)
    if n == 0:
        return {"value": None, "ci": None, "n": 0}
    ci = bootstrap_ci(
        lambda idx: statistic(values[idx]), n, n_bootstrap=n_bootstrap, seed=seed, confidence=confidence
    )
    return {"value": float(statistic(values)), "ci": ci, "n": n}


# --------------------------------------------------------------------------------------------
# Paired proportions
#
# Accuracy candidate − champion on the same tasks is a difference of two paired proportions, and only the discordant
# tasks move it: `gained` (the candidate right, the champion wrong) and `lost` (the reverse). A percentile bootstrap of
# it is as narrow as a Wald interval near the point when the discordant tasks all go one way (a candidate worse by the
# margin that only loses tasks), so the gate promoted such candidates 6.2 % of the time against a nominal 2.5 %
# (bench/gate_error_rates.py). Tango's score interval takes its variance at each hypothesised difference instead of at
# the estimate, and is defined for every table, none or all of the tasks discordant included.

PAIRED_ACCURACY_METHOD = "Tango score interval (paired proportions)"
BISECTIONS = 60  # halvings of an end's bracket, at most 2: far below any difference that matters


def two_sided_z(confidence: float) -> float:
    """The z of a two-sided interval at `confidence` (1.96 at 0.95)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def tango_statistic(gained: Any, lost: Any, n: int, delta: float) -> Any:
    """Tango's (1998, Stat Med 17:891) score statistic for H0: difference = `delta` on an n-task paired table
    (elementwise over arrays of counts): (gained − lost − nδ) / √(n(2p + δ(1 − δ))), where p, the lost cell's
    probability fitted under H0 by maximum likelihood, is the larger root of 2n·p² + (−g − l + (2n − g + l)δ)·p
    − l·δ(1 − δ) = 0. Where that variance is 0 (δ = ±1) it is ±inf by the numerator's sign, 0 when that is 0 too."""
    gained, lost = np.asarray(gained, dtype=float), np.asarray(lost, dtype=float)
    linear = -gained - lost + (2.0 * n - gained + lost) * delta
    constant = -lost * delta * (1.0 - delta)
    lost_cell = (np.sqrt(np.maximum(linear * linear - 8.0 * n * constant, 0.0)) - linear) / (4.0 * n)
    variance = n * (2.0 * lost_cell + delta * (1.0 - delta))
    observed = gained - lost - n * delta
    spread = np.sqrt(np.where(variance > 0.0, variance, 1.0))
    edge = np.where(observed == 0.0, 0.0, np.copysign(np.inf, observed))
    statistic = np.where(variance > 0.0, observed / spread, edge)
    return float(statistic) if statistic.ndim == 0 else statistic


def _boundary(outside: Callable[[float], bool], low: float, high: float) -> float:
    """Where `outside`, true at `low` and false at `high`, turns false (bisection)."""
    for _ in range(BISECTIONS):
        middle = (low + high) / 2.0
        low, high = (middle, high) if outside(middle) else (low, middle)
    return (low + high) / 2.0


def paired_score_interval(gained: int, lost: int, n: int, *, confidence: float = DEFAULT_CONFIDENCE) -> list[float]:
    """Tango's asymptotic score interval for the paired difference (gained − lost)/n: every δ whose score statistic
    (`tango_statistic`, decreasing in δ) lies within ±z, its ends found by bisection on [−1, point] and [point, 1].
    Never NaN: no discordant task gives ±z²/(n + z²), where a bootstrap gives [0, 0]; all of them one way reach ±1."""
    counts = (gained, lost, n)
    if any(isinstance(v, bool) or not isinstance(v, int | np.integer) for v in counts) or not (
            n >= 1 and gained >= 0 and lost >= 0 and gained + lost <= n):
        raise BadInput(f"a paired table needs 0 <= gained, lost and gained + lost <= n >= 1, got gained={gained!r}, "
                       f"lost={lost!r}, n={n!r}", fix="count the tasks only one of the two models got right")
    if not 0.0 < confidence < 1.0:
        raise BadInput(f"confidence must be in (0, 1), got {confidence!r}", fix="use e.g. 0.95")
    z, point = two_sided_z(confidence), (gained - lost) / n
    low = _boundary(lambda delta: tango_statistic(gained, lost, n, delta) > z, -1.0, point)
    high = _boundary(lambda delta: tango_statistic(gained, lost, n, delta) > -z, point, 1.0)
    return [low, high]


# --------------------------------------------------------------------------------------------
# Paired comparisons


def _aligned(
    candidate: ScoredPredictions, champion: ScoredPredictions
) -> tuple[list[str], np.ndarray, np.ndarray]:
    cand_pos = {ident: i for i, ident in enumerate(candidate.ids)}
    champ_pos = {ident: i for i, ident in enumerate(champion.ids)}
    shared = sorted(cand_pos.keys() & champ_pos.keys())
    return (
        shared,
        np.asarray([cand_pos[i] for i in shared], dtype=int),
        np.asarray([champ_pos[i] for i in shared], dtype=int),
    )


def paired_mean_difference(
    candidate: ScoredPredictions,
    champion: ScoredPredictions,
    values: Callable[[ScoredPredictions], np.ndarray],
    *,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict:
    """Mean of a per-task value (`values(scored)`, one float a row; NaN where it was not measured), candidate −
    champion, on the shared task ids where both measured it, with a paired bootstrap interval."""
    _, cand_idx, champ_idx = _aligned(candidate, champion)
    cand_values = np.asarray(values(candidate), dtype=float)[cand_idx]
    champ_values = np.asarray(values(champion), dtype=float)[champ_idx]
    both = np.isfinite(cand_values) & np.isfinite(champ_values)
    cand_values, champ_values = cand_values[both], champ_values[both]
    if cand_values.size == 0:
        return {"n": 0, "candidate": None, "champion": None, "difference": None, "ci": None}
    return paired_bootstrap(
        lambda idx: float(cand_values[idx].mean()),
        lambda idx: float(champ_values[idx].mean()),
        int(cand_values.size),
        n_bootstrap=n_bootstrap,
        seed=seed,
        confidence=confidence,
    )


def paired_accuracy_difference(
    candidate: ScoredPredictions,
    champion: ScoredPredictions,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict:
    """Accuracy of candidate − champion on their shared task ids, with Tango's score interval (`paired_score_interval`)
    and the discordant counts it rests on: `gained` (only the candidate right) and `lost` (only the champion)."""
    shared, cand_idx, champ_idx = _aligned(candidate, champion)
    if not shared:
        return {"n": 0, "candidate": None, "champion": None, "difference": None, "ci": None,
                "method": PAIRED_ACCURACY_METHOD}
    cand_correct, champ_correct = candidate.correct[cand_idx], champion.correct[champ_idx]
    n = len(shared)
    gained, lost = int(np.sum(cand_correct & ~champ_correct)), int(np.sum(champ_correct & ~cand_correct))
    return {
        "n": n,
        "candidate": float(cand_correct.mean()),
        "champion": float(champ_correct.mean()),
        "difference": (gained - lost) / n,
        "ci": paired_score_interval(gained, lost, n, confidence=confidence),
        "method": PAIRED_ACCURACY_METHOD,
        "gained": gained,
        "lost": lost,
    }


def paired_ece_difference(
    candidate: ScoredPredictions,
    champion: ScoredPredictions,
    *,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict:
    """ECE of candidate − champion on shared task ids where both are valid, paired bootstrap interval."""
    shared, cand_idx, champ_idx = _aligned(candidate, champion)
    both = candidate.valid[cand_idx] & champion.valid[champ_idx]
    cand_idx, champ_idx = cand_idx[both], champ_idx[both]
    if cand_idx.size == 0:
        return {"n": 0, "candidate": None, "champion": None, "difference": None, "ci": None}
    cand_conf, cand_ok = candidate.confidence[cand_idx], candidate.correct[cand_idx]
    champ_conf, champ_ok = champion.confidence[champ_idx], champion.correct[champ_idx]
    return paired_bootstrap(
        lambda idx: expected_calibration_error(cand_conf[idx], cand_ok[idx]),
        lambda idx: expected_calibration_error(champ_conf[idx], champ_ok[idx]),
        int(cand_idx.size),
        n_bootstrap=n_bootstrap,
        seed=seed,
        confidence=confidence,
    )


# --------------------------------------------------------------------------------------------
# Latency


def _start_key(index: int, row: Mapping[str, Any]) -> float:
    started = row["started_at"]
    if isinstance(started, bool) or started is None:
        raise _row_error(index, row, f"started_at must be an ISO-8601 string or epoch seconds, got {started!r}")
    if isinstance(started, int | float):
        return float(started)
    if isinstance(started, str):
        try:
            return datetime.fromisoformat(started).timestamp()
        except ValueError as exc:
            raise _row_error(index, row, f"started_at {started!r} is not ISO-8601") from exc
    raise _row_error(index, row, f"started_at must be an ISO-8601 string or epoch seconds, got {started!r}")


def latency_summary(
    predictions: Sequence[Mapping[str, Any]],
    *,
    warmup: int = 0,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict:
    """Client latency of successful requests ordered by started_at: the first reported apart (cold),
    the next `warmup` excluded, then p50/p90/p95/p99 (linear percentiles) and mean with intervals."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise BadInput(f"warmup must be a non-negative integer, got {warmup!r}", fix="pass e.g. warmup=0")
    timed = _timed(predictions)
    summary: dict[str, Any] = {
        "unit": "ms",
        "source": "client",
        "n_successful": len(timed),
        "first_ms": timed[0][2] if timed else None,
        "first_id": timed[0][3] if timed else None,
        "warmup": warmup,
    }
    steady = np.asarray([latency for _, _, latency, _ in timed[1 + warmup :]], dtype=float)
    summary["n"] = int(steady.size)
    summary["mean"] = _estimate(
        steady, lambda x: float(x.mean()), n_bootstrap=n_bootstrap, seed=seed, confidence=confidence
    )
    for q in LATENCY_PERCENTILES:
        summary[f"p{q}"] = _estimate(
            steady,
            lambda x, q=q: float(np.percentile(x, q)),
            n_bootstrap=n_bootstrap,
            seed=seed,
            confidence=confidence,
        )
    return summary


def paired_latency_ratio(
    candidate: Sequence[Mapping[str, Any]],
    champion: Sequence[Mapping[str, Any]],
    *,
    quantile: float = 95,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict:
    """Candidate p`quantile` latency over the champion's on the requests both answered (paired by id), with a paired
    percentile-bootstrap interval: each resample draws requests with replacement and takes both sides' latencies of
    the same requests, so what the requests share (their length, the machine's load while both were measured
    side by side) cancels. Each side's first request by `started_at` (its cold one, reported apart by
    `latency_summary`) and requests either side did not answer, or timed at 0 ms, are left out. `ratio` is
    dimensionless (1.0: as fast; 1.5: 50 % slower at that percentile); `difference` is candidate − champion in ms."""
    _check_bootstrap_args(n_bootstrap, confidence)
    if not 0.0 < quantile < 100.0:
        raise BadInput(f"quantile must be in (0, 100), got {quantile!r}", fix="use e.g. 95")
    cand, champ = _answered_latencies(candidate), _answered_latencies(champion)
    shared = sorted(cand.keys() & champ.keys())
    empty = {"n": len(shared), "quantile": quantile, "candidate": None, "champion": None, "ratio": None, "ci": None,
             "difference": None, "difference_ci": None}
    if not shared:
        return empty
    mine = np.asarray([cand[i] for i in shared], dtype=float)
    theirs = np.asarray([champ[i] for i in shared], dtype=float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(shared), size=(n_bootstrap, len(shared)))
    mine_q = np.percentile(mine[draws], quantile, axis=1)
    theirs_q = np.percentile(theirs[draws], quantile, axis=1)
    point_mine, point_theirs = float(np.percentile(mine, quantile)), float(np.percentile(theirs, quantile))
    return {
        **empty,
        "candidate": point_mine, "champion": point_theirs,
        "ratio": point_mine / point_theirs, "ci": _percentile_interval(mine_q / theirs_q, confidence),
        "difference": point_mine - point_theirs, "difference_ci": _percentile_interval(mine_q - theirs_q, confidence),
    }


def _timed(predictions: Sequence[Mapping[str, Any]]) -> list[tuple[float, int, float, str]]:
    """(start, index, latency ms, id) of every successful request, ordered by start; a latency that is not a finite
    non-negative number is bad input."""
    timed = []
    for index, row in enumerate(predictions):
        _check_row(index, row)
        if row["error"] is not None:
            continue
        latency = row["latency_ms"]
        number = isinstance(latency, int | float) and not isinstance(latency, bool)
        if not number or not math.isfinite(latency) or latency < 0:
            raise _row_error(index, row, f"latency_ms must be a finite non-negative number, got {latency!r}")
        timed.append((_start_key(index, row), index, float(latency), row["id"]))
    timed.sort()
    return timed


def _answered_latencies(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """id -> client latency of every successful request timed above 0 ms, less the first by start (its cold one)."""
    return {ident: latency for _, _, latency, ident in _timed(rows)[1:] if latency > 0}


def throughput(predictions: Sequence[Mapping[str, Any]]) -> dict:
    """Answers per second over the run: successful rows over the span from the first request's start to the last
    answer's end (the gate's own rate at its concurrency, a floor on what the endpoint can do, not its capacity)."""
    spans = [(_start_key(index, row), _start_key(index, row) + float(row["latency_ms"]) / 1000)
             for index, row in enumerate(predictions) if row.get("error") is None]
    seconds = max(end for _, end in spans) - min(start for start, _ in spans) if spans else 0.0
    return {"answers": len(spans), "seconds": seconds,
            "answers_per_second": len(spans) / seconds if seconds > 0 else None}


# --------------------------------------------------------------------------------------------
# All together


def decision_metrics(
    predictions: Sequence[Mapping[str, Any]],
    *,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    warmup: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict:
    """Every decision metric with bootstrap intervals and sample sizes, as one JSON-able dict."""
    scored = score_predictions(predictions)
    boot = {"n_bootstrap": n_bootstrap, "seed": seed, "confidence": confidence}
    valid = scored.valid
    conf, ok = scored.confidence[valid], scored.correct[valid]
    pairs = np.stack([conf, ok.astype(float)], axis=1)
    mass = scored.allowed_token_mass[np.isfinite(scored.allowed_token_mass)]
    return {
        "n": scored.n,
        "n_valid": int(valid.sum()),
        "accuracy": _estimate(scored.correct.astype(float), lambda x: float(x.mean()), **boot),
        "validity": _estimate(valid.astype(float), lambda x: float(x.mean()), **boot),
        "ece": _estimate(pairs, lambda x: expected_calibration_error(x[:, 0], x[:, 1]), **boot),
        "brier": _estimate(scored.brier[valid], lambda x: float(x.mean()), **boot),
        "nll": _estimate(nll_terms(scored.p_true[valid]), lambda x: float(x.mean()), **boot),
        "allowed_token_mass": _estimate(mass, lambda x: float(x.mean()), **boot),
        "reliability": reliability_table(conf, ok),
        "latency_ms": latency_summary(predictions, warmup=warmup, **boot),
        "throughput": throughput(predictions),
        "retries_503": scored.retries_503,
        "errors": scored.errors,
        "bootstrap": {**boot, "method": "percentile"},
        "definitions": {
            "ece_bins": N_BINS,
            "validity_sum_tolerance": SUM_TOLERANCE,
            "nll_clip": NLL_CLIP,
            "calibration_rows": "valid rows only",
            "tie_rule": "lexicographically smallest label",
        },
    }
