"""A sweep's policy on the orchestrators, from the one stage table (light: the sweep DAG reads it at parse time): the
pool a sweep's candidates run in, how often a candidate's step is retried, and how long it may take."""

from __future__ import annotations

from typing import Any

from shiplift.tasks.pipeline.table import STAGES_THROUGH_GATE, TEARDOWN, timeout_for

# A candidate's stages retry inside its step (each under the table's retries); the step itself is tried once more
# after a retryable error or a worker that died, and resumes at the candidate's first stage not done.
EVALUATE_RETRIES = 1
CANDIDATE_STAGES = (*STAGES_THROUGH_GATE, TEARDOWN)


def airflow_pool(sweep_name: str) -> str:
    """The Airflow pool a sweep's candidate tasks run in (created with the sweep's `parallel` slots)."""
    return f"shiplift-sweep-{sweep_name}"


def candidate_timeout_s(config: Any) -> int:
    """How long one candidate's step may take: every stage through the gate and its teardown, one attempt each
    (`timeout_for` the candidate's config). A candidate whose stages need their retries may outlast it; the step's own
    retry then resumes at the stage it was in."""
    return sum(timeout_for(name, config) for name in CANDIDATE_STAGES)
