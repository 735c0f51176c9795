"""The local router's counters per component (and per spec of the copy that answered), in the spirit of CloudWatch's
endpoint metrics: invocations, 4xx, 5xx, model errors, no-capacity failures and a latency histogram."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
LATENCY_WINDOW = 4096


@dataclass
class ComponentMetrics:
    """Counters in the spirit of CloudWatch's endpoint metrics, per component.

    A transport failure (timeout, reset, no copy reachable) counts as a model error and a 5xx.
    """

    invocations: int = 0
    invocation_4xx_errors: int = 0
    invocation_5xx_errors: int = 0
    model_errors: int = 0
    no_capacity_invocation_failures: int = 0  # requests that found a component scaled to zero (not forwarded)
    histogram: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))
    recent_ms: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))

    def record(self, status: int | None, latency_ms: float) -> None:
        """Count one forwarded request (caller holds the router lock)."""
        self.invocations += 1
        if status is None or status >= 500:
            self.invocation_5xx_errors += 1
        elif status >= 400:
            self.invocation_4xx_errors += 1
        if status is None or not 200 <= status < 300:
            self.model_errors += 1
        bucket = next(
            (i for i, edge in enumerate(LATENCY_BUCKETS_MS) if latency_ms <= edge),
            len(LATENCY_BUCKETS_MS),
        )
        self.histogram[bucket] += 1
        self.recent_ms.append(latency_ms)

    def snapshot(self) -> dict[str, Any]:
        """JSON view: counters, the histogram and percentiles of the recent window."""
        ordered = sorted(self.recent_ms)

        def percentile(q: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

        edges = [f"le_{edge}" for edge in LATENCY_BUCKETS_MS] + ["gt_60000"]
        return {
            "invocations": self.invocations,
            "invocation_4xx_errors": self.invocation_4xx_errors,
            "invocation_5xx_errors": self.invocation_5xx_errors,
            "model_errors": self.model_errors,
            "no_capacity_invocation_failures": self.no_capacity_invocation_failures,
            "latency_ms": {
                "histogram": dict(zip(edges, self.histogram, strict=True)),
                "window": len(ordered),
                "p50": percentile(0.50),
                "p95": percentile(0.95),
                "p99": percentile(0.99),
            },
        }
