"""Bake-time alarms of a rolling update: read the new model's own metrics during each wait interval.

The same `BakeAlarms` rules name the thresholds on every backend; here they are evaluated against the
metrics seam (`Metrics.component_metrics(..., spec_sha256=...)`), so an alarm judges only the
copies that serve the candidate's spec, even while old copies still answer beside them.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from tasks.errors import NotFound
from tasks.interfaces import ComponentMetrics, Metrics, RolloutStep


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


class BakeWatch:
    """A bake: after each batch, replay the online gate's canary set (when there is one), then for `wait_s` read
    the new copies' metrics every `rules.check_interval_s`; the first alarm (which rolls back) ends it. What the
    online gate saw is kept per step for the ledger."""

    def __init__(self, metrics: Metrics, endpoint: str, component: str, spec_sha256: str, rules, wait_s: float, *,
                 online_gate: Any = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self.metrics, self.endpoint, self.component, self.spec_sha256 = metrics, endpoint, component, spec_sha256
        self.rules, self.wait_s, self.online_gate = rules, wait_s, online_gate
        self.sleep, self.clock = sleep, clock
        self.evidence: dict[tuple[str, int], dict[str, Any]] = {}

    def _read(self) -> str | None:
        try:
            seen = self.metrics.component_metrics(self.endpoint, self.component, window_s=max(60.0, self.wait_s),
                                                  spec_sha256=self.spec_sha256)
        except NotFound:
            return None  # the new copies have answered nothing yet
        return alarm_for(seen, self.rules)

    def __call__(self, step: RolloutStep) -> str | None:
        deadline = self.clock() + self.wait_s
        gate_alarm = None
        if self.online_gate is not None:
            self.online_gate.replay()
            gate_alarm = self.online_gate.alarm()
            self.evidence[(step.phase, step.batch)] = {"online_gate": self.online_gate.evidence()}
        while True:
            alarm = gate_alarm or self._read()
            left = deadline - self.clock()
            if alarm or left <= 0:
                return alarm
            self.sleep(min(self.rules.check_interval_s, left))

    def steps_with_evidence(self, steps) -> list[dict[str, Any]]:
        """The rollout's steps as JSON, each with what the online gate saw during its bake."""
        return [{**step.model_dump(), **self.evidence.get((step.phase, step.batch), {})} for step in steps]
