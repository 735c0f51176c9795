"""The one table of release steps (DESIGN §4): name, function, retries, timeout, idempotence.

`tasks.pipeline.release`, the Airflow DAG factory, the Step Functions renderer and the CLI all read this
table, so their retry policies and timeouts cannot disagree. It imports nothing heavy (DAG files
read it at parse time); `function()` imports a stage's module only when the stage runs.

Retries are for an attempt that died (a lost worker, a throttled API, capacity not yet free):
every stage is idempotent (content-derived names; a succeeded stage returns its recorded result),
so the numbers only weigh cost. validate re-runs a whole evaluation and promote changes
production, so they get one retry each; teardown must happen, so it gets the most.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from tasks.backends.interfaces import DEPLOY_WAIT_S, TEARDOWN_WAIT_S
from tasks.ledger import events


@dataclass(frozen=True)
class Step:
    """One step of a release run: a stage, or the begin/end bookends of an orchestrated run."""

    name: str
    function: str  # "module:attribute", imported lazily
    retries: int
    timeout_s: int  # per attempt; the config can only lengthen it (see `timeout_for`)
    idempotent: bool
    doc: str
    waits: str | None = None  # "module:attribute" asked before the stage runs: True holds the release there

    def load(self, reference: str | None = None) -> Callable[..., Any]:
        """The step's function, or another "module:attribute" of it (`waits`), imported now."""
        module, _, attribute = (reference or self.function).partition(":")
        return getattr(importlib.import_module(module), attribute)


MINUTE, HOUR = 60, 3600
STAGES: tuple[Step, ...] = (
    Step(events.RESOLVE, "tasks.pipeline.stages.resolve:run", 2, 30 * MINUTE, True, "fetch the pinned source and prove it by sha256"),
    Step(events.BUILD, "tasks.pipeline.stages.build:run", 2, HOUR, True, "quantize or export the model, check it, fit a temperature"),
    Step(events.PACKAGE, "tasks.pipeline.stages.package:run", 2, 30 * MINUTE, True, "write model.tar.gz and store it by content"),
    Step(events.IMAGE, "tasks.pipeline.stages.image:run", 2, HOUR, True, "build or find the serving image and pin it by digest"),
    Step(events.DEPLOY_CANDIDATE, "tasks.pipeline.stages.candidate:deploy", 2, 2 * HOUR, True, "serve the artifact on a candidate endpoint"),
    Step(events.VALIDATE, "tasks.pipeline.stages.validate:run", 1, 2 * HOUR, True, "gate the live candidate against the champion"),
    Step(events.PROMOTE, "tasks.pipeline.stages.promote:run", 1, 2 * HOUR, True, "put a passed candidate on production, verify what serves",
         waits="tasks.pipeline.approval:waits_before_promote"),
    Step(events.TEARDOWN, "tasks.pipeline.stages.candidate:teardown", 3, TEARDOWN_WAIT_S + 15 * MINUTE, True,
         "remove the candidate, whatever happened"),
)
BEGIN = Step("begin", "tasks.pipeline.release:begin_orchestrated", 1, 5 * MINUTE, True,
             "validate the config, open the release in the ledger, take the model's lease")
END = Step("end", "tasks.pipeline.release:end_orchestrated", 2, 5 * MINUTE, True, "record the final status, give the lease back")
STAGE_NAMES: tuple[str, ...] = tuple(step.name for step in STAGES)
STEPS: dict[str, Step] = {step.name: step for step in (BEGIN, *STAGES, END)}
TEARDOWN = events.TEARDOWN


def stage(name: str) -> Step:
    """The table entry of a stage; BadInput names the known stages."""
    if name not in STAGE_NAMES:
        from tasks.errors import BadInput

        raise BadInput(f"unknown stage {name!r}", fix=f"use one of {', '.join(STAGE_NAMES)}")
    return STEPS[name]


# What a step adds to the config's own deadlines: starting its servers, reading and writing the store and the ledger.
STAGE_MARGIN_S = 15 * MINUTE
# The longest any orchestrator may hold a worker for one step. Airflow's Celery executor redelivers a task that runs
# past the broker's visibility timeout (86,400 s by default for Redis and SQS) to a second worker, which would run the
# same stage twice at once; Step Functions is held to the same bound so the two orchestrators agree.
MAX_STEP_TIMEOUT_S = 24 * HOUR


@dataclass(frozen=True)
class RetryBackoff:
    """How long to wait before each retry of a retryable failure: exponential from `first_s`, capped at `max_s`."""

    first_s: float
    factor: float
    max_s: float

    def delay(self, attempt: int) -> float:
        """The wait before retry number `attempt` (1-based)."""
        return min(self.max_s, self.first_s * self.factor ** (attempt - 1))


BACKOFF = RetryBackoff(first_s=30.0, factor=2.0, max_s=10 * MINUTE)


@dataclass(frozen=True)
class LeasePolicy:
    """The model's promotion lease: it outlives the gap between two orchestrated steps (`ttl_s`) and is renewed by
    every running step (`renew_every_s`), so a long stage never lets a second run take it."""

    ttl_s: float
    renew_every_s: float


LEASE = LeasePolicy(ttl_s=4 * HOUR, renew_every_s=5 * MINUTE)


def timeout_for(name: str, config: Any) -> int:
    """A step's timeout per attempt for one config: the table's, or longer where the config's own deadlines need it.

    validate scores every dataset on the candidate and on the champion, each run under `validation.deadline_s`; build
    fits a temperature (when asked) with one run under it; image waits up to the aws backend's `build_timeout_s` for CodeBuild;
    deploy_candidate and promote wait for a placement's provision timeout, and promote for a rolling update's own
    maximum execution time. Every orchestrator (CLI, Airflow, Step Functions) uses this number.
    """
    validation, own = config.validation, 0
    if name == "validate":
        own = int(validation.deadline_s * 2 * len(validation.datasets)) + STAGE_MARGIN_S
    elif name == "build" and config.calibration.fit_temperature:
        own = int(validation.deadline_s) + HOUR + STAGE_MARGIN_S
    elif name == "image":
        own = getattr(config.backend, "build_timeout_s", 0) + STAGE_MARGIN_S
    if name in ("deploy_candidate", "promote"):
        own = getattr(config.placement, "provision_timeout_s", 0) + DEPLOY_WAIT_S + STAGE_MARGIN_S
    if name == "promote":  # a rolling update may take up to its own maximum execution time
        own = max(own, getattr(config.rollout, "maximum_execution_timeout_s", 0) + DEPLOY_WAIT_S + STAGE_MARGIN_S)
    return max(STEPS[name].timeout_s, own)


def timeouts_for(config: Any) -> dict[str, int]:
    """`timeout_for` of every step (begin, the stages, end)."""
    return {name: timeout_for(name, config) for name in STEPS}


def check_timeouts(config: Any, allowed: dict[str, int] | None = None) -> None:
    """ConfigError unless every step's timeout fits the orchestrator: `allowed` (what it was set up with, per step)
    and MAX_STEP_TIMEOUT_S. Run at `begin`, before anything is created."""
    from tasks.errors import ConfigError

    needed = timeouts_for(config)
    too_long = [(name, seconds, min(MAX_STEP_TIMEOUT_S, (allowed or {}).get(name, MAX_STEP_TIMEOUT_S)))
                for name, seconds in needed.items()
                if seconds > min(MAX_STEP_TIMEOUT_S, (allowed or {}).get(name, MAX_STEP_TIMEOUT_S))]
    if too_long:
        listed = "; ".join(f"{name} needs {seconds} s, the orchestrator allows {limit} s" for name, seconds, limit in too_long)
        raise ConfigError(
            f"the config's deadlines do not fit its orchestrator's timeouts: {listed}",
            fix="shorten validation.deadline_s, backend.build_timeout_s, placement.provision_timeout_s or "
                "rollout.maximum_execution_timeout_s; or, where the orchestrator was set up from another version of the "
                "config, re-parse the DAG or re-render and deploy the state machine from this one",
        )


def policy_rows(config: Any) -> list[dict[str, Any]]:
    """The policy every orchestrator applies to one config, a row per step: retries, what is retried, the backoff,
    the timeout (the table's and this config's). What `shiplift policy CONFIG` prints."""
    from tasks.errors import error_classes

    retried = ", ".join(cls.__name__ for cls in error_classes() if cls.retryable)
    backoff = f"{BACKOFF.first_s:.0f}s x{BACKOFF.factor:g} up to {BACKOFF.max_s:.0f}s"
    return [{"step": name, "retries": step.retries, "retried": retried if step.retries else None,
             "backoff": backoff if step.retries else None, "table_timeout_s": step.timeout_s,
             "timeout_s": timeout_for(name, config), "does": step.doc} for name, step in STEPS.items()]

