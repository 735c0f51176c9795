"""A deferred stage under an orchestrator (the table's `defers`: deploy_candidate, promote): its start, then its polls,
with no worker held between them; once a poll says in service (promote: production's update has ended), the
orchestrator runs the stage itself (`run_orchestrated_stage`), which finds the work done and records its result
(promote: judges the update's last step and rolls back what its verdict refuses).

Airflow's deferrable deploy task (dags/_shiplift_triggers.py) and the Step Functions Wait/Choice loop
(tasks.orchestrators.step_functions_defer) call these two, so both keep the ledger the same way: the start records
the stage `started` (teardown then knows there may be a candidate to remove, and the candidate's cost counts from
there), a failed start or poll records it `failed` with the error, as a stage run does. Each poll renews the run's lease
(the wait holds it, as a running stage does) and enforces the stage's timeout from that `started` record, so no
orchestrator needs a counter of its own.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from shiplift.tasks.backends.interfaces import DeployPoll, Progress
from shiplift.tasks.errors import BadInput, Conflict, StepTimedOut, Throttled
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.timestamps import parse_utc, utcnow
from shiplift.tasks.pipeline import table
from shiplift.tasks.pipeline.release import (
    StageContext,
    ensure_stage,
    failure_recorded,
    print_progress,
    reopen_release,
)


def start_orchestrated(release_id: str, name: str, *, holder: str | None = None, ledger_url: str | None = None,
                       state_dir: str | Path | None = None, actor: str | None = None,
                       progress: Progress = print_progress, session: Any = None) -> dict:
    """Record the stage started and run its `defers.start` (which returns at once): `{"started": …}` to poll next, or
    `{"finished": result}` when the stage already succeeded (a retried task, a rerun), nothing started again."""
    ctx, step = _reopened(release_id, name, holder=holder, ledger_url=ledger_url, state_dir=state_dir, actor=actor,
                          progress=progress, session=session)
    if ctx.state.stage(name)["status"] == "succeeded":
        return {"finished": ensure_stage(ctx, name).record()}
    ctx.say(f"{name}: started (deferred: polled every {step.defers.every_s}s, no worker held meanwhile)")
    ctx.record(name, events.STARTED, {"deferred": True})
    with failure_recorded(ctx, name):
        ctx.require_lease()
        started = step.load(step.defers.start)(ctx)
    return {"started": started}


def poll_orchestrated(release_id: str, name: str, *, holder: str | None = None, ledger_url: str | None = None,
                      state_dir: str | Path | None = None, actor: str | None = None,
                      progress: Progress = print_progress, session: Any = None) -> dict:
    """One poll of a started deferred stage: `{"done": bool, "status": …, "left_s": …}`. Renews the lease; a failure
    the backend reports, a lost lease, or the stage's timeout (`timeout_for` its config, counted from its `started`
    record) passing, is recorded `failed` and raised. A throttled look is no failure: the next poll looks again."""
    ctx, step = _reopened(release_id, name, holder=holder, ledger_url=ledger_url, state_dir=state_dir, actor=actor,
                          progress=progress, session=session)
    status = ctx.state.stage(name)["status"]
    if status == "succeeded":
        return {"done": True, "status": "succeeded", "left_s": 0}
    if status != "started":
        raise Conflict(f"{name} of {release_id} is {status}: there is no start to poll",
                       fix="run the stage's start first (the orchestrator's deploy task does); a failed one is "
                           "started again by its retry")
    deadline = _started_at(ctx, name) + timedelta(seconds=table.timeout_for(name, ctx.config))
    with failure_recorded(ctx, name):
        ctx.require_lease()
        try:
            polled: DeployPoll = step.load(step.defers.poll)(ctx)
        except Throttled as exc:
            polled = DeployPoll(in_service=False, status=f"not looked at this time ({exc.problem})")
        left_s = (deadline - utcnow()).total_seconds()
        if not polled.in_service and left_s <= 0:
            raise StepTimedOut(f"step {name} ran past its timeout of {table.timeout_for(name, ctx.config)} s, still "
                               f"{polled.status}",
                               fix="find what made it slow (the backend's console, the stage's progress lines); the "
                                   "timeout is the policy table's, lengthened only by the config's own deadlines")
    ctx.say(f"{name}: {polled.status}" + ("" if polled.in_service else f"; {left_s:.0f}s left"))
    return {"done": polled.in_service, "status": polled.status, "left_s": max(0, round(left_s))}


def _reopened(release_id: str, name: str, *, holder: str | None, **reopen: Any) -> tuple[StageContext, table.Step]:
    """The release's context (its lease held by `holder`) and the stage's table entry; BadInput unless it defers."""
    step = table.stage(name)
    if step.defers is None:
        deferring = ", ".join(s.name for s in table.STAGES if s.defers)
        raise BadInput(f"stage {name} does not defer: it runs whole", fix=f"defer one of {deferring}")
    ctx = reopen_release(release_id, **reopen)
    ctx.lease_holder = holder
    return ctx, step


def _started_at(ctx: StageContext, name: str) -> datetime:
    """When the stage's latest `started` record was appended (its deferred start)."""
    record = next(r for r in reversed(ctx.state.records) if (r.stage, r.event) == (name, events.STARTED))
    return parse_utc(record.recorded_at)
