"""Temperature scaling (DESIGN §8.2): fit one T by NLL on a calibration split, apply it at serve time.

probabilities = softmax(option_logits / T). T > 1 softens an over-confident model, T < 1
sharpens an under-confident one. The fit minimises the mean NLL of the expected option over
log T (bounded Brent), so the search is symmetric in "hotter" and "colder".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from shiplift.tasks.errors import BadInput

MIN_SAMPLES = 10
DEFAULT_BOUNDS = (0.05, 20.0)
LOG_T_TOLERANCE = 1e-6


class TemperatureFit(BaseModel):
    """Result of a temperature fit; nll_before is at T = 1 on the same rows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float
    nll_before: float
    nll_after: float
    n: int
    converged: bool
    at_bound: bool
    bounds: tuple[float, float]


def _padded_logits(option_logits: Sequence[Sequence[float]]) -> np.ndarray:
    """Rows of possibly different lengths as one array padded with −inf (which softmax ignores)."""
    width = max(len(row) for row in option_logits)
    padded = np.full((len(option_logits), width), -np.inf)
    for i, row in enumerate(option_logits):
        padded[i, : len(row)] = row
    return padded


def _check_logit_rows(option_logits: Sequence[Sequence[float]]) -> None:
    for i, row in enumerate(option_logits):
        if isinstance(row, str) or not isinstance(row, Sequence | np.ndarray) or len(row) < 2:
            raise BadInput(
                f"option_logits row {i} must be a list of at least 2 numbers, got {row!r}",
                fix="pass one list of option logits per task",
            )
        if any(isinstance(v, bool) or not isinstance(v, int | float | np.floating) for v in row):
            raise BadInput(f"option_logits row {i} holds a non-number: {row!r}", fix="pass numeric logits")
        if not all(math.isfinite(float(v)) for v in row):
            raise BadInput(
                f"option_logits row {i} holds a non-finite logit: {list(row)!r}",
                fix="drop or repair rows whose server returned inf/nan logits before fitting",
            )


def _mean_nll(logits: np.ndarray, true_index: np.ndarray, temperature: float) -> float:
    scaled = logits / temperature
    top = scaled.max(axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(scaled - top).sum(axis=1))
    return float(np.mean(log_norm - scaled[np.arange(len(true_index)), true_index]))


def fit_temperature(
    option_logits: list[list[float]],
    expected_index: list[int],
    *,
    bounds: tuple[float, float] = DEFAULT_BOUNDS,
) -> TemperatureFit:
    """Fit T minimising the NLL of softmax(logits / T) on a calibration split (≥ 10 rows)."""
    from scipy.optimize import minimize_scalar

    if len(option_logits) != len(expected_index):
        raise BadInput(
            f"{len(option_logits)} logit rows but {len(expected_index)} expected indices",
            fix="pass one expected index per logit row",
        )
    if len(option_logits) < MIN_SAMPLES:
        raise BadInput(
            f"a temperature fit needs at least {MIN_SAMPLES} samples, got {len(option_logits)}",
            fix="use a larger calibration split",
        )
    low, high = bounds
    if not (math.isfinite(low) and math.isfinite(high) and 0.0 < low < high):
        raise BadInput(f"bounds must satisfy 0 < low < high, got {bounds!r}", fix="use e.g. (0.05, 20.0)")
    _check_logit_rows(option_logits)
    for i, (row, truth) in enumerate(zip(option_logits, expected_index, strict=True)):
        if isinstance(truth, bool) or not isinstance(truth, int | np.integer) or not 0 <= truth < len(row):
            raise BadInput(
                f"expected_index[{i}] = {truth!r} is not an option index for a row of {len(row)} options",
                fix="pass the 0-based position of the expected label in that row's options",
            )
    logits = _padded_logits(option_logits)
    truth = np.asarray(expected_index, dtype=int)
    result = minimize_scalar(
        lambda log_t: _mean_nll(logits, truth, math.exp(log_t)),
        bounds=(math.log(low), math.log(high)),
        method="bounded",
        options={"xatol": LOG_T_TOLERANCE},
    )
    temperature = float(math.exp(result.x))
    nll_before = _mean_nll(logits, truth, 1.0)
    nll_after = _mean_nll(logits, truth, temperature)
    if low <= 1.0 <= high and nll_after > nll_before:  # flat near T = 1: keep the better point
        temperature, nll_after = 1.0, nll_before
    at_bound = (
        abs(math.log(temperature) - math.log(low)) < 1e-3 or abs(math.log(temperature) - math.log(high)) < 1e-3
    )
    return TemperatureFit(
        temperature=temperature,
        nll_before=nll_before,
        nll_after=nll_after,
        n=len(option_logits),
        converged=bool(result.success),
        at_bound=at_bound,
        bounds=(float(low), float(high)),
    )


def apply_temperature(
    logits: Sequence[float] | Sequence[Sequence[float]], temperature: float
) -> list[float] | list[list[float]]:
    """softmax(logits / T) for one row of option logits, or for each of several rows."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not (
        math.isfinite(temperature) and temperature > 0
    ):
        raise BadInput(f"temperature must be a finite number > 0, got {temperature!r}", fix="use a fitted T")
    if len(logits) and isinstance(logits[0], Sequence | np.ndarray):
        _check_logit_rows(logits)  # type: ignore[arg-type]
        return [_softmax(np.asarray(row, dtype=float) / temperature) for row in logits]  # type: ignore[arg-type]
    _check_logit_rows([logits])  # type: ignore[list-item]
    return _softmax(np.asarray(logits, dtype=float) / temperature)


def _softmax(scaled: np.ndarray) -> list[float]:
    shifted = np.exp(scaled - scaled.max())
    return (shifted / shifted.sum()).tolist()
