"""Bake-time alarms of a rolling update: read the new model's own metrics during each wait interval.

The same `BakeAlarms` rules name the thresholds on every backend; here they are evaluated against the
metrics seam (`Metrics.component_metrics(..., spec_sha256=...)`), so an alarm judges only the
copies that serve the candidate's spec, even while old copies still answer beside them.
"""

from __future__ import annotations

import time
from typing import Callable

from tasks.errors import NotFound
from tasks.interfaces import Bake, ComponentMetrics, Metrics, RolloutStep


def alarm_for(metrics: ComponentMetrics, rules) -> str | None:
    """The alarm these metrics of the new copies fire under `rules` (a BakeAlarms), or None."""
    if metrics.invocations < rules.min_invocations:
        return None
    failed = max(metrics.errors_5xx, metrics.model_errors)  # a 5xx from the model counts once, as CloudWatch does
    rate = failed / metrics.invocations
    if rate > rules.max_error_rate:
        return (f"error rate {rate:.3f} ({failed} of {metrics.invocations} answers were 5xx or model errors) "
                f"is over rollout.alarms.max_error_rate {rules.max_error_rate}")
    p99 = metrics.latency_p99_ms
    if rules.max_latency_p99_ms is not None and p99 is not None and p99 > rules.max_latency_p99_ms:
        return f"latency p99 {p99:.1f} ms is over rollout.alarms.max_latency_p99_ms {rules.max_latency_p99_ms:g}"
    return None


def bake_watch(metrics: Metrics, endpoint: str, component: str, spec_sha256: str, rules, wait_s: float, *,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> Bake:
    """A bake: for `wait_s` after each batch, read the new copies' metrics every `rules.check_interval_s`, and
    return the first alarm (which rolls back) or None when the wait ends quietly."""

    def read() -> str | None:
        try:
            seen = metrics.component_metrics(endpoint, component, window_s=max(60.0, wait_s),
                                             spec_sha256=spec_sha256)
        except NotFound:
            return None  # the new copies have answered nothing yet
        return alarm_for(seen, rules)

    def bake(step: RolloutStep) -> str | None:
        deadline = clock() + wait_s
        while True:
            alarm = read()
            left = deadline - clock()
            if alarm or left <= 0:
                return alarm
            sleep(min(rules.check_interval_s, left))

    return bake
