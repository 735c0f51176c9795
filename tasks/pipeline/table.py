"""The one policy table (DESIGN §4): every step an orchestrator runs, with its retries, timeout and what it does with
the model's promotion lease.

The CLI (`attempts`, below), the Airflow DAG factory and the Step Functions renderer read this table, so their retry
policies, per-attempt timeouts and lease handling cannot disagree; `tests/dags/test_policy_everywhere.py` compares
what each of them does, step by step, with it. It imports nothing heavy (DAG files read it at parse time); `load()`
imports a step's module only when the step runs.

Retries are for an attempt that died of a retryable error (`tasks.errors`: a throttled API, capacity not yet free, a
server still loading): every step is idempotent (content-derived names; a succeeded stage returns its recorded
result), so the numbers only weigh cost. validate re-runs a whole evaluation and promote changes production, so they
get one retry each; teardown must happen, so it gets the most. An attempt that runs past its timeout is not retried
anywhere (the CLI's StepTimedOut, Airflow's AirflowTaskTimeout and Step Functions' States.Timeout are not retryable):
what made it slow would make the next attempt slow too.
"""

from __future__ import annotations

import importlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from shiplift.tasks.backends.interfaces import DEPLOY_WAIT_S, SCALE_WAIT_S, TEARDOWN_WAIT_S
from shiplift.tasks.errors import BadInput, ConfigError, StepTimedOut, error_classes, is_retryable
from shiplift.tasks.ledger import events

Orchestrator = Literal["cli", "airflow", "step_functions"]
# What a step does with the model's promotion lease: takes it (begin), holds it (renews it while it runs; promote
# requires it), releases it while a person decides (nobody else is blocked for days), waits without it, takes it back
# (to go on after the decision), gives it back (end), takes and gives back its own (a triggered promotion or rollback),
# or has nothing to do with it.
Lease = Literal["takes", "holds", "releases", "not held", "takes back", "gives back", "own", "none"]
EVERYWHERE: frozenset[Orchestrator] = frozenset({"cli", "airflow", "step_functions"})
MINUTE, HOUR = 60, 3600


@dataclass(frozen=True)
class Defer:
    """A stage whose long wait holds no worker (docs/airflow.md, docs/step-functions.md): `start` ("module:attribute",
    given the stage context) begins the work and returns at once, `poll` looks once (a `DeployPoll`, its failure
    raised) and is asked every `every_s` seconds until it says in service; then the stage itself runs and finds the
    work done (deploy_candidate: the endpoint; promote: production's update ended, its last step judged there). The
    CLI runs the stage whole (it waits inside)."""

    start: str
    poll: str
    every_s: int


@dataclass(frozen=True)
class Step:
    """One step an orchestrator runs: a stage, a bookend of a release, an approval step, or a triggered action."""

    name: str
    function: str  # "module:attribute" the orchestrators call (imported lazily); "" for one Step Functions runs itself
    retries: int
    timeout_s: int  # per attempt; the config can only lengthen it (see `timeout_for`)
    lease: Lease
    doc: str
    runs_in: frozenset[Orchestrator] = EVERYWHERE
    waits: str | None = None  # "module:attribute" asked before the stage runs: True holds the release there
    person: bool = False  # a person's wait: no worker runs, so MAX_STEP_TIMEOUT_S does not bound it
    defers: Defer | None = None  # Airflow and Step Functions start it, then poll it without holding a worker

    def load(self, reference: str | None = None) -> Callable[..., Any]:
        """The step's function, or another "module:attribute" of it (`waits`), imported now."""
        module, _, attribute = (reference or self.function).partition(":")
        return getattr(importlib.import_module(module), attribute)


# The longest any orchestrator may hold a worker for one step. Airflow's Celery executor redelivers a task that runs
# past the broker's visibility timeout (86,400 s by default for Redis and SQS) to a second worker, which would run the
# same stage twice at once; Step Functions and the CLI are held to the same bound so the three agree.
MAX_STEP_TIMEOUT_S = 24 * HOUR
# How often a deferred stage is polled: SageMaker takes minutes to bring an endpoint up; the Amazon provider's
# SageMaker triggers poll every 30 s too.
POLL_EVERY_S = 30
STAGES: tuple[Step, ...] = (
    Step(events.RESOLVE, "shiplift.tasks.pipeline.stages.resolve:run", 2, 30 * MINUTE, "holds",
         "fetch the pinned source and prove it by sha256"),
    Step(events.BUILD, "shiplift.tasks.pipeline.stages.build:run", 2, HOUR, "holds",
         "quantize or export the model, check it, fit a temperature"),
    Step(events.PACKAGE, "shiplift.tasks.pipeline.stages.package:run", 2, 30 * MINUTE, "holds",
         "write model.tar.gz and store it by content"),
    Step(events.IMAGE, "shiplift.tasks.pipeline.stages.image:run", 2, HOUR, "holds",
         "build or find the serving image and pin it by digest"),
    Step(events.DEPLOY_CANDIDATE, "shiplift.tasks.pipeline.stages.candidate:deploy", 2, 2 * HOUR, "holds",
         "serve the artifact on a candidate endpoint",
         defers=Defer("shiplift.tasks.pipeline.stages.candidate:start", "shiplift.tasks.pipeline.stages.candidate:poll",
                      POLL_EVERY_S)),
    Step(events.VALIDATE, "shiplift.tasks.pipeline.stages.validate:run", 1, 2 * HOUR, "holds",
         "gate the live candidate against the champion"),
    Step(events.PROMOTE, "shiplift.tasks.pipeline.stages.promote:run", 1, 2 * HOUR, "holds",
         "put a passed candidate on production, verify what serves",
         waits="shiplift.tasks.pipeline.approval:waits_before_promote",
         defers=Defer("shiplift.tasks.pipeline.stages.promote:start", "shiplift.tasks.pipeline.stages.promote:poll",
                      POLL_EVERY_S)),
    Step(events.TEARDOWN, "shiplift.tasks.pipeline.stages.candidate:teardown", 3, TEARDOWN_WAIT_S + 15 * MINUTE,
         "holds",
         "remove the candidate, whatever happened"),
)
BEGIN = Step("begin", "shiplift.tasks.pipeline.release:begin_orchestrated", 1, 5 * MINUTE, "takes",
             "validate the config, open the release in the ledger, take the model's lease")
END = Step("end", "shiplift.tasks.pipeline.release:end_orchestrated", 2, 5 * MINUTE, "gives back",
           "record the final status, give the lease back")
# Where the config requires an approval, between validate and promote (docs/approval.md).
APPROVAL_REQUEST = Step("approval_request", "shiplift.tasks.pipeline.approval_steps:request_approval_orchestrated", 2,
                        TEARDOWN_WAIT_S + 15 * MINUTE, "releases",
                        "record the approval request once the gate passed, tear "
                        "the candidate down unless the config keeps it, give the lease back while a person decides")
APPROVAL = Step("approval", "", 0, 0, "not held", "a person approves or rejects the release (or its deadline passes)",
                person=True)
APPROVAL_DECISION = Step("approval_decision", "shiplift.tasks.pipeline.approval_steps:record_decision_orchestrated", 2,
                         5 * MINUTE,
                         "takes back", "record the decision (or the timeout) and take the lease back to go on")
# Step Functions reads validate's published result itself (an SDK integration), to choose whether to promote.
READ_GATE = Step("read_gate", "", 3, MINUTE, "none", "read the gate decision validate published to S3",
                 runs_in=frozenset({"step_functions"}))
# Triggered by a person (promote_release DAG, `shiplift rollback`): its release's config is not known when the DAG is
# parsed, so it gets the longest a worker may be held.
PROMOTE_RELEASE = Step("promote_release", "shiplift.tasks.pipeline.promotion:promote", 1, MAX_STEP_TIMEOUT_S, "own",
                       "promote a gated release with its own rollout, under the model's lease",
                       runs_in=frozenset({"airflow"}))
ROLLBACK = Step("rollback", "shiplift.tasks.pipeline.promotion:rollback", 1, MAX_STEP_TIMEOUT_S, "own",
                "put an earlier promoted release back on production, under the model's lease",
                runs_in=frozenset({"cli", "airflow"}))
FLEET_MOVE = Step("fleet_move", "shiplift.tasks.pipeline.fleet.move:move_fleet", 1, MAX_STEP_TIMEOUT_S, "own",
                  "a layout change: every model of a shared endpoint moved to the new layout's endpoint, each under "
                  "its lease; the old endpoint retired once callers switched (--retire-old)",
                  runs_in=frozenset({"cli"}))
AUDIT = Step("audit", "shiplift.tasks.pipeline.audit:audit", 1, 10 * MINUTE, "none",
             "verify the ledger against its checkpoints, then what serves against the ledger",
             runs_in=frozenset({"airflow"}))
STAGE_NAMES: tuple[str, ...] = tuple(step.name for step in STAGES)
# The stages from resolve to the gate (validate): what every release runs before its gate is decided (and, where its
# config requires one, before the approval).
STAGES_THROUGH_GATE: tuple[str, ...] = STAGE_NAMES[:-2]
STEPS: dict[str, Step] = {step.name: step for step in (BEGIN, *STAGES[:-2], APPROVAL_REQUEST, APPROVAL,
                                                        APPROVAL_DECISION, READ_GATE, *STAGES[-2:], END,
                                                        PROMOTE_RELEASE, ROLLBACK, FLEET_MOVE, AUDIT)}
# What a release runs, in order (the approval's three steps only where its config requires one).
RELEASE_STEPS: tuple[str, ...] = ("begin", *STAGES_THROUGH_GATE, "approval_request", "approval", "approval_decision",
                                  *STAGE_NAMES[-2:], "end")
TEARDOWN = events.TEARDOWN


def stage(name: str) -> Step:
    """The table entry of a stage; BadInput names the known stages."""
    if name not in STAGE_NAMES:
        raise BadInput(f"unknown stage {name!r}", fix=f"use one of {', '.join(STAGE_NAMES)}")
    return STEPS[name]


# What a step adds to the config's own deadlines: starting its servers, reading and writing the store and the ledger.
STAGE_MARGIN_S = 15 * MINUTE


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

    validate scores every dataset on the candidate and on the champion, each run under `validation.deadline_s`, after
    the cold starts of a config that scales to zero or is serverless (each a copy stopped, then up to twice its bound);
    build fits a temperature (when asked) with one run under it; image waits up to the aws backend's `build_timeout_s`
    for CodeBuild; deploy_candidate and promote wait for a placement's provision timeout, and promote for a rolling
    update's own maximum execution time; the approval waits `promotion.approval.timeout_s` for a person. Every
    orchestrator (CLI, Airflow, Step Functions) uses this number.
    """
    validation, own = config.validation, 0
    if name == "validate":
        own = int(validation.deadline_s * 2 * len(validation.datasets)) + STAGE_MARGIN_S
        bound = getattr(config, "cold_start_bound", None)
        if bound is not None:  # each cold start: its copies stopped (a scale wait), on aws its instances given back
            starts, max_p95_s = bound
            own += starts * (SCALE_WAIT_S + getattr(config.backend, "instance_release_wait_s", 0)
                             + math.ceil(2 * max_p95_s))
    elif name == "build" and config.calibration.fit_temperature:
        own = int(validation.deadline_s) + HOUR + STAGE_MARGIN_S
    elif name == "image":
        own = getattr(config.backend, "build_timeout_s", 0) + STAGE_MARGIN_S
    elif name == "approval":
        own = math.ceil(config.promotion.approval.timeout_s)
    if name in ("deploy_candidate", "promote"):
        own = getattr(config.placement, "provision_timeout_s", 0) + DEPLOY_WAIT_S + STAGE_MARGIN_S
    if name == "promote":  # a rolling update may take up to its own maximum execution time
        own = max(own, getattr(config.rollout, "maximum_execution_timeout_s", 0) + DEPLOY_WAIT_S + STAGE_MARGIN_S)
    return max(STEPS[name].timeout_s, own)


def timeouts_for(config: Any) -> dict[str, int]:
    """`timeout_for` of every step a release of `config` runs (begin, the stages, the approval's steps, end)."""
    return {name: timeout_for(name, config) for name in RELEASE_STEPS}


def check_timeouts(config: Any, allowed: dict[str, int] | None = None) -> None:
    """ConfigError unless every step's timeout fits the orchestrator: `allowed` (what it was set up with, per step)
    and, for a step that holds a worker, MAX_STEP_TIMEOUT_S. Run at `begin`, before anything is created."""
    needed = timeouts_for(config)

    def limit(name: str) -> int | None:
        bound = (allowed or {}).get(name)
        if STEPS[name].person:  # no worker waits for a person: only what the orchestrator was set up with bounds it
            return bound
        return MAX_STEP_TIMEOUT_S if bound is None else min(MAX_STEP_TIMEOUT_S, bound)

    too_long = [(name, seconds, limit(name)) for name, seconds in needed.items()
                if limit(name) is not None and seconds > limit(name)]
    if too_long:
        listed = "; ".join(f"{name} needs {seconds} s, the orchestrator allows {most} s" for name, seconds,
                           most in too_long)
        raise ConfigError(
            f"the config's deadlines do not fit its orchestrator's timeouts: {listed}",
            fix="shorten validation.deadline_s, backend.build_timeout_s, placement.provision_timeout_s, "
                "rollout.maximum_execution_timeout_s or promotion.approval.timeout_s; or, where the orchestrator was "
                "set up from another version of the config, re-parse the DAG or re-render and deploy the state "
                "machine from this one",
        )


def policy_rows(config: Any) -> list[dict[str, Any]]:
    """The policy every orchestrator applies to one config, a row per step: where it runs, retries, what is retried,
    the backoff, the timeout (the table's and this config's), the lease. What `shiplift policy CONFIG` prints."""
    retried = ", ".join(cls.__name__ for cls in error_classes() if cls.retryable)
    backoff = f"{BACKOFF.first_s:.0f}s x{BACKOFF.factor:g} up to {BACKOFF.max_s:.0f}s"
    needed = timeouts_for(config)
    return [{"step": name, "runs in": ", ".join(sorted(step.runs_in)), "retries": step.retries,
             "retried": retried if step.retries else None, "backoff": backoff if step.retries else None,
             "table_timeout_s": step.timeout_s or None, "timeout_s": needed.get(name, step.timeout_s) or None,
             "lease": step.lease, "defers": f"polled every {step.defers.every_s}s" if step.defers else None,
             "does": step.doc} for name, step in STEPS.items()]


T = TypeVar("T")


def attempts(name: str, run: Callable[[], T], *, timeout_s: int,
             say: Callable[[str], None] = lambda message: None) -> T:
    """Run one step as the CLI does, under the table's policy for it: each attempt under `timeout_s` (the step's
    `timeout_for` its config), a failure whose error says `retryable` retried up to the step's retries with the
    table's backoff, any other failure (a timeout included) raised at once."""
    retries = STEPS[name].retries
    for attempt in range(1, retries + 2):
        try:
            with attempt_deadline(name, timeout_s, say):
                return run()
        except Exception as exc:
            if not is_retryable(exc) or attempt > retries:
                raise
            delay = BACKOFF.delay(attempt)
            say(f"{name}: {type(exc).__name__} is retryable; attempt {attempt + 1} of {retries + 1} in {delay:.0f}s")
            time.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


@contextmanager
def attempt_deadline(name: str, timeout_s: float, say: Callable[[str], None]) -> Iterator[None]:
    """Raise StepTimedOut in this (the main) thread when the block runs past `timeout_s`, as Airflow's
    execution_timeout does in a task: a real-time interval timer and its SIGALRM. A deadline already running (a step
    inside a step) is kept when it is the earlier one, and restored after. Off the main thread no signal reaches the
    block: it runs without a deadline, and `say` warns of it."""
    if threading.current_thread() is not threading.main_thread():
        say(f"WARNING {name}: no {timeout_s:.0f} s deadline off the main thread (the CLI enforces it with a signal)")
        yield
        return
    started = time.monotonic()
    outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
    if outer_left and outer_left <= timeout_s:  # the outer deadline comes first: it stays in force
        yield
        return

    def timed_out(signum, frame):
        raise StepTimedOut(f"step {name} ran past its timeout of {timeout_s:.0f} s per attempt",
                           fix="find what made it slow (the ledger's started record and the progress lines say where "
                               "it was); the timeout is the policy table's, lengthened only by the config's own "
                               "deadlines")

    previous = signal.signal(signal.SIGALRM, timed_out)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer_left - (time.monotonic() - started)))
