"""The one table of release steps (DESIGN §4): name, function, retries, timeout, idempotence.

`tasks.release`, the Airflow DAG factory, the Step Functions renderer and the CLI all read this
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


@dataclass(frozen=True)
class Step:
    """One step of a release run: a stage, or the begin/end bookends of an orchestrated run."""

    name: str
    function: str  # "module:attribute", imported lazily
    retries: int
    timeout_s: int  # per attempt; the config can only lengthen it (see `timeout_for`)
    idempotent: bool
    doc: str

    def load(self) -> Callable[..., Any]:
        module, _, attribute = self.function.partition(":")
        return getattr(importlib.import_module(module), attribute)


MINUTE, HOUR = 60, 3600
# The longest a backend waits in one deploy (endpoint start + component start, on top of an instance pool's
# provision timeout) and in one teardown (component and endpoint deletion); tasks/aws/hosting.py keeps to these.
DEPLOY_WAIT_S = HOUR
TEARDOWN_WAIT_S = HOUR
STAGES: tuple[Step, ...] = (
    Step("resolve", "tasks.stages.resolve:run", 2, 30 * MINUTE, True, "fetch the pinned source and prove it by sha256"),
    Step("build", "tasks.stages.build:run", 2, HOUR, True, "quantize or export the model, check it, fit a temperature"),
    Step("package", "tasks.stages.package:run", 2, 30 * MINUTE, True, "write model.tar.gz and store it by content"),
    Step("image", "tasks.stages.image:run", 2, HOUR, True, "build or find the serving image and pin it by digest"),
    Step("deploy_candidate", "tasks.stages.candidate:deploy", 2, 2 * HOUR, True, "serve the artifact on a candidate endpoint"),
    Step("validate", "tasks.stages.validate:run", 1, 2 * HOUR, True, "gate the live candidate against the champion"),
    Step("promote", "tasks.stages.promote:run", 1, 2 * HOUR, True, "put a passed candidate on production, verify what serves"),
    Step("teardown_candidate", "tasks.stages.candidate:teardown", 3, TEARDOWN_WAIT_S + 15 * MINUTE, True,
         "remove the candidate, whatever happened"),
)
BEGIN = Step("begin", "tasks.release:begin_orchestrated", 1, 5 * MINUTE, True,
             "validate the config, open the release in the ledger, take the model's lease")
END = Step("end", "tasks.release:end_orchestrated", 2, 5 * MINUTE, True, "record the final status, give the lease back")
STAGE_NAMES: tuple[str, ...] = tuple(step.name for step in STAGES)
STEPS: dict[str, Step] = {step.name: step for step in (BEGIN, *STAGES, END)}
TEARDOWN = "teardown_candidate"


def stage(name: str) -> Step:
    """The table entry of a stage; BadInput names the known stages."""
    if name not in STAGE_NAMES:
        from tasks.errors import BadInput

        raise BadInput(f"unknown stage {name!r}", fix=f"use one of {', '.join(STAGE_NAMES)}")
    return STEPS[name]


def timeout_for(name: str, config: Any, *, startup_allowance_s: int = 15 * MINUTE) -> int:
    """A step's timeout for one config: never shorter than the config's own deadlines."""
    own = 0
    if name == "validate":
        own = int(config.validation.deadline_s) + startup_allowance_s
    elif name in ("deploy_candidate", "promote"):
        own = getattr(config.placement, "provision_timeout_s", 0) + DEPLOY_WAIT_S + startup_allowance_s
    if name == "promote":  # a rolling update may take up to its own maximum execution time
        own = max(own, getattr(config.rollout, "maximum_execution_timeout_s", 0) + DEPLOY_WAIT_S + startup_allowance_s)
    return max(STEPS[name].timeout_s, own)
