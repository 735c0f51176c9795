"""Cold starts of a component that scales to zero, and the gate's check on them.

A cold start is timed from the first request sent to a component with no copy until that request is answered: the
runtime answers it (and every retry while a copy starts) with its retryable no-capacity error, the caller backs off
and retries, nothing is dropped. The check reads the nearest-rank p95 of the starts (with 20 starts or fewer, the
slowest but the nineteenth-twentieth; with 3, the slowest) against the config's bound, and fails when any start got
no answer before its deadline.

What a start measures depends on the hosting, and the gate report says which (`cold_start_kind`): on aws, a start from
zero instances, as users meet it once the endpoint has given back its instances (SageMaker stops an endpoint's last
instance only minutes after its last copy, and starting it again takes minutes more:
https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html, "the provisioning process
takes several minutes"); on the local backend, a copy restart on a machine that keeps running, which is faster than
what users of an endpoint at zero instances meet.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shiplift.validation.gates import Check
from shiplift.validation.transport import post_with_retries, run_options

CHECK_NAME = "cold_start_p95_s"
FROM_ZERO_INSTANCES = "from zero instances"  # the endpoint had given back its instances: an instance, then a copy
COPY_RESTART = "copy restart"  # a copy started again on an instance (or machine) that kept running
ATTEMPTS_WITHIN_DEADLINE = 1_000_000  # retries are bounded by the start's deadline, not by a count


@dataclass(frozen=True)
class ColdStart:
    """One start from zero: seconds to the first answer, the attempts it took, and the error when none came."""

    seconds: float
    attempts: int
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "attempts": self.attempts, "error": self.error}


def cold_start_kind(hosting: Any) -> str:
    """What a cold start on `hosting` measures: from zero instances where the hosting can wait for its endpoint to give
    its instances back (aws: `wait_for_zero_instances`), else a copy restart (local)."""
    return FROM_ZERO_INSTANCES if callable(getattr(hosting, "wait_for_zero_instances", None)) else COPY_RESTART


def stop_for_cold_start(hosting: Any, endpoint: str, component: str, *, progress: Callable[[str], None]) -> str:
    """Stop every copy of the component and, where the hosting can, wait (its deadline) until the endpoint has given
    back its instances, so the next request starts cold as users meet it; returns the kind measured
    (`cold_start_kind`)."""
    hosting.set_copies(endpoint, component, 0, progress=progress)
    kind = cold_start_kind(hosting)
    if kind == FROM_ZERO_INSTANCES:
        hosting.wait_for_zero_instances(endpoint, progress=progress)
    return kind


def first_answer(invoker: Any, body: bytes, *, timeout_s: float, deadline_s: float,
                 rng: random.Random | None = None) -> ColdStart:
    """Send `body` to a component scaled to zero and retry its retryable answers until one is answered or
    `deadline_s` passes. The backoff's cap is a fiftieth of the deadline (0.2–10 s), so the timing's resolution
    scales with what is measured."""
    cap = max(0.2, min(10.0, deadline_s / 50))
    opts = run_options(invoker, concurrency=1, timeout_s=timeout_s, max_attempts=ATTEMPTS_WITHIN_DEADLINE,
                       backoff_base_s=0.05, backoff_cap_s=cap, inference_component=None, deadline_s=deadline_s,
                       rng=rng, sleep=time.sleep)
    channel = opts.invoker.open()
    started = time.monotonic()
    try:
        exchange = post_with_retries(channel, body, opts)
    finally:
        channel.close()
    return ColdStart(seconds=time.monotonic() - started, attempts=exchange.attempts, error=exchange.error)


def nearest_rank(values: Sequence[float], quantile: float) -> float:
    """The nearest-rank percentile: the smallest value with at least `quantile` of the values at or below it."""
    if not values or not 0 < quantile <= 1:
        raise ValueError(f"need values and 0 < quantile <= 1, got {len(values)} values and {quantile}")
    ordered = sorted(values)
    return ordered[max(1, math.ceil(quantile * len(ordered))) - 1]


def cold_start_check(starts: Sequence[ColdStart], max_p95_s: float) -> dict[str, Any]:
    """The gate check of the starts' p95 against `max_p95_s` (as a gate report lists its checks)."""
    unanswered = [s for s in starts if s.error]
    p95 = nearest_rank([s.seconds for s in starts], 0.95)
    if unanswered:
        status, reason = "fail", (f"{len(unanswered)} of {len(starts)} starts got no answer: {unanswered[0].error}")
    elif p95 <= max_p95_s:
        status, reason = "pass", f"p95 of {len(starts)} cold starts {p95:.2f} s <= {max_p95_s:g} s"
    else:
        status, reason = "fail", f"p95 of {len(starts)} cold starts {p95:.2f} s > {max_p95_s:g} s"
    check = Check(name=CHECK_NAME, status=status, observed=round(p95, 3), threshold=max_p95_s, comparator="<=",
                  ci=None, n=len(starts), reason=reason, rule="point")
    return {**check.model_dump(mode="json"), "passed": check.passed}
