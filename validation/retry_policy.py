"""The one retry policy of every shiplift client (applied by `validation.transport.post_with_retries`), apart from the
transport so that configs and command lines can name its defaults without loading the HTTP machinery."""

from __future__ import annotations

import random
from dataclasses import dataclass

# SageMaker's provisioning from zero instances "takes several minutes"
# (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html): ten cover it
DEFAULT_RETRY_DEADLINE_S = 600.0


@dataclass(frozen=True)
class RetryPolicy:
    """How every shiplift client retries a retryable answer: capped exponential backoff with full jitter, until the
    endpoint has answered nothing for `retry_deadline_s` (None: the run's deadline alone bounds it) or, when set,
    `max_attempts` attempts were made; another 5xx or a network failure gets `error_retries` more tries."""

    backoff_base_s: float = 0.2
    backoff_cap_s: float = 5.0
    retry_deadline_s: float | None = DEFAULT_RETRY_DEADLINE_S
    max_attempts: int | None = None
    error_retries: int = 1

    def delay(self, retries: int, rng: random.Random) -> float:
        """The wait before retry number `retries` + 1: uniform in [0, min(cap, base * 2**retries)]."""
        return rng.uniform(0.0, min(self.backoff_cap_s, self.backoff_base_s * 2 ** min(retries, 64)))

    def attempts_left(self, attempts: int) -> bool:
        """Whether another attempt is allowed after `attempts`."""
        return self.max_attempts is None or attempts < self.max_attempts


DEFAULT_POLICY = RetryPolicy()
