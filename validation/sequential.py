"""An always-valid sequential test of a paired mean difference: look after every batch without inflating errors.

The champion checks judge d_i = candidate − champion per task (accuracy: correct_candidate − correct_champion), each in
[−1, 1]. A fixed-size interval read again after every added batch would pass a worse candidate more often the more
often it is read; a confidence sequence does not: it holds at every look at once. This one is the betting confidence
sequence of Waudby-Smith & Ramdas (2023, "Estimating means of bounded random variables by betting", JRSS B), on
x_i = (d_i + 1)/2 ∈ [0, 1]. For a candidate value θ of the mean of x, the capital

    K⁺_t(θ) = ∏_{i≤t} (1 + λ_i (x_i − θ))        K⁻_t(θ) = ∏_{i≤t} (1 − λ_i (x_i − θ))

is a non-negative supermartingale when the mean is ≤ θ (K⁺) or ≥ θ (K⁻), so by Ville's inequality it ever reaches
2/α with probability at most α/2. The bets λ_i(θ) ≥ 0 are predictable (from the tasks before i only), one sequence per
θ: the adaptive Kelly bet ("aGRAPA", §5 of the paper) (μ̂ − θ)/(σ̂² + (μ̂ − θ)²) for K⁺ and its mirror for K⁻, from the
running mean and variance of x (a prior task at ½ with variance ¼), truncated at ¾/θ for K⁺ and ¾/(1 − θ) for K⁻ (the
paper's truncation), so every factor stays ≥ ¼ whatever x is. A cap that does not scale with θ (¾ for every θ) needs
about twice the tasks near θ ≈ ½ to decide. The bets need no horizon, so a caller may look again after each batch with
the looks so far.
The check PASSES at the first look where K⁺(θ₀) reaches 2/α (the mean difference is better than −margin), FAILS where
K⁻(θ₀) does (worse than −margin), else is inconclusive at the last look: at most α/2 false passes (and α/2 false
fails) however many looks. Its interval at the stopping look is {θ: K⁺_t(θ) < 2/α and K⁻_t(θ) < 2/α} with the same
bets (valid at every θ, narrowest near θ₀, so it agrees with the verdict), in units of d.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

import numpy as np

from shiplift.tasks.errors import BadInput

MAX_LOSS = 0.75  # truncation of λ(θ) at MAX_LOSS/θ (K⁺) or MAX_LOSS/(1 − θ) (K⁻): every factor of the capital is ≥ ¼
BISECTIONS = 60  # halvings of [0, 1] when the interval's ends are sought (far below any difference that matters)


@dataclass(frozen=True)
class SequentialResult:
    """Where the sequence stopped: its status, the paired tasks and looks it used, its interval there, and why."""

    status: Literal["pass", "fail", "inconclusive"]
    n: int  # paired tasks used when it stopped
    looks: int  # looks taken
    interval: tuple[float, float]  # the confidence sequence's interval for the mean difference at the stopping look
    reason: str


def extension_looks(first_n: int, *, batch: int, max_tasks: int) -> list[int]:
    """The looks after the first fixed-size gate of `first_n` tasks: first_n + batch, first_n + 2·batch, … up to
    first_n + max_tasks (the last one there even when max_tasks is not a multiple of batch)."""
    for name, value, least in (("first_n", first_n, 0), ("batch", batch, 1), ("max_tasks", max_tasks, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise BadInput(f"{name} must be an integer >= {least}, got {value!r}", fix=f"pass {name} >= {least}")
    looks = list(range(first_n + batch, first_n + max_tasks + 1, batch))
    if not looks or looks[-1] != first_n + max_tasks:
        looks.append(first_n + max_tasks)
    return looks


def _bets(x: np.ndarray, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """The predictable bets (λ⁺, λ⁻) against "mean ≤ θ" and "mean ≥ θ": each from x_1..x_{i−1} only (running mean
    and variance with a prior task at ½, ¼), the adaptive Kelly bet truncated to [0, MAX_LOSS/θ] and
    [0, MAX_LOSS/(1 − θ)]."""
    t = np.arange(1, len(x) + 1)
    mean = (0.5 + np.cumsum(x)) / (t + 1)  # μ̂ after i tasks
    before = np.concatenate([[0.5], mean[:-1]])  # μ̂ after i − 1
    variance = (0.25 + np.cumsum((x - before) ** 2)) / (t + 1)
    variance_before = np.concatenate([[0.25], variance[:-1]])
    edge = before - theta
    kelly = edge / (variance_before + edge**2)
    up_cap = MAX_LOSS / theta if theta > 0 else np.inf
    down_cap = MAX_LOSS / (1.0 - theta) if theta < 1 else np.inf
    return np.clip(kelly, 0.0, up_cap), np.clip(-kelly, 0.0, down_cap)


def _log_capital(x: np.ndarray, theta: float, sign: float) -> float:
    """log K±_t(θ) of all of `x` with θ's own bets (sign +1: against "mean ≤ θ", −1: against "mean ≥ θ")."""
    bets = _bets(x, theta)[0 if sign > 0 else 1]
    return float(np.sum(np.log1p(sign * bets * (x - theta))))


def _end(x: np.ndarray, threshold: float, sign: float) -> float:
    """The interval's lower end (sign +1: the least θ whose K⁺ stays below the threshold) or upper end (sign −1: the
    greatest θ whose K⁻ stays below it), by bisection on [0, 1] (a rejected θ lies beyond the end: below the mean's
    range for K⁺, above it for K⁻)."""
    low, high = 0.0, 1.0
    if sign > 0 and _log_capital(x, 0.0, sign) < threshold:
        return 0.0
    if sign < 0 and _log_capital(x, 1.0, sign) < threshold:
        return 1.0
    for _ in range(BISECTIONS):
        middle = (low + high) / 2.0
        rejected = _log_capital(x, middle, sign) >= threshold
        if (sign > 0) == rejected:
            low = middle
        else:
            high = middle
    return high if sign > 0 else low


def sequential_champion_check(differences: Sequence[float], *, margin: float, confidence: float = 0.95,
                              higher_is_better: bool = True, looks: Sequence[int]) -> SequentialResult:
    """Judge candidate − champion (`differences`, per paired task in the order observed, each in [−1, 1]) at each of
    `looks` (increasing task counts ≤ len(differences)): pass at the first look where the mean difference is shown
    better than −margin (+margin for a lower-is-better metric), fail where it is shown worse, else inconclusive at the
    last look. Each wrong verdict has probability ≤ (1 − confidence)/2 over all looks together
    (the module's docstring)."""
    d = np.asarray(differences, dtype=float)
    if d.ndim != 1 or not np.all(np.isfinite(d)) or np.any(np.abs(d) > 1.0):
        raise BadInput("differences must be finite numbers in [-1, 1] (candidate - champion per paired task)",
                       fix="pass one value per paired task, e.g. correct_candidate - correct_champion")
    if isinstance(margin, bool) or not 0.0 <= margin < 1.0:
        raise BadInput(f"margin must be in [0, 1), got {margin!r}", fix="use the champion rule's margin, e.g. 0.02")
    if not 0.0 < confidence < 1.0:
        raise BadInput(f"confidence must be in (0, 1), got {confidence!r}", fix="use e.g. 0.95")
    looks = list(looks)
    if not looks or any(isinstance(k, bool) or not isinstance(k, int) for k in looks) or looks[0] < 1 \
            or any(b <= a for a, b in pairwise(looks)) or looks[-1] > len(d):
        raise BadInput(f"looks must be increasing task counts from 1 to {len(d)} (the differences given), "
                       f"got {looks!r}",
                       fix="build them with extension_looks(first_n, batch=..., max_tasks=...)")
    sign = 1.0 if higher_is_better else -1.0
    x = (sign * d + 1.0) / 2.0  # mirrored for a lower-is-better metric, so "good" is always high
    alpha = 1.0 - confidence
    threshold = math.log(2.0 / alpha)
    theta = (1.0 - margin) / 2.0  # mean difference −margin, in units of x
    for taken, n in enumerate(looks, start=1):
        seen = x[:n]
        passed = _log_capital(seen, theta, +1.0) >= threshold
        failed = _log_capital(seen, theta, -1.0) >= threshold
        if passed or failed or taken == len(looks):
            status = "pass" if passed else "fail" if failed else "inconclusive"
            low, high = _end(seen, threshold, +1.0), _end(seen, threshold, -1.0)
            ends = sorted((sign * (2.0 * low - 1.0), sign * (2.0 * high - 1.0)))
            interval = (float(ends[0]), float(ends[1]))
            bound = f"{'-' if higher_is_better else '+'}{margin:g}"
            what = {"pass": f"shown better than {bound}", "fail": f"shown worse than {bound}",
                    "inconclusive": f"neither shown better nor worse than {bound}"}[status]
            return SequentialResult(status=status, n=n, looks=taken, interval=interval,
                                    reason=f"candidate - champion {what} after {n} paired tasks ({taken} look(s)); "
                                           f"confidence sequence [{interval[0]:.4f}, {interval[1]:.4f}] "
                                           f"at {confidence:g}")
    raise AssertionError("unreachable: the last look always returns")
