"""promote: put the gated candidate on the production component, then verify what actually serves.

`all_at_once` replaces every copy at once; `canary` and `linear` roll the component batch by batch
with a bake after each, judged by the config's bake alarms on the candidate's own answers and, when
the config has one, by the online gate (the canary set replayed through the live component). A
rollout an alarm stopped ends `rolled_back` with the alarm as its reason, once the previous model is
seen serving again. A canary or linear first release (nothing serves yet) starts every copy and bakes them as one step
under the same alarms and online gate; one that fails live is taken out of service (its component deleted) and ends
`rolled_back` too, with nothing serving. An online gate that has not decided is never a pass
(`validation.online_gate`): on SageMaker, one still undecided when the rolling update has ended is judged then, and
one that has not passed puts the previous spec back (`tasks.backends.aws.hosting_rollout`), so the release ends
`rolled_back` with the gate's alarm. Production scaled to zero is no first release: its rollout starts the
candidate's copies batch by batch and bakes each, and scale to zero applies again only once the release has passed.

The rollout is recorded as it happens (`TrafficLog`, told by the hosting): a traffic record (stage `traffic`, event
`step`) the moment a step's copies have moved (batch n of N with the copies of each spec, or SageMaker's n-th check
with the component's copies and alarm states), with the release it moves from and what the backend describes as
serving then; a verdict record (stage `bake`, event `verdict`) the moment its bake has judged it (each alarm's state,
the online gate's evidence, the alarm that fired). The ledger stamps each record when it is appended, so `ledger as-of`
at a moment between two batches sees both releases serving. The stage's own record lists every step with its verdict.

Under an orchestrator the wait for production's update holds no worker (the table's `defers`, docs/airflow.md):
`start` sends the update (what it replaces recorded first, `rollout`/`replaced`), `poll` looks once and, while it runs,
makes one check of it, and `run`, once it has ended, follows it and judges its last step, as it does after a crash.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from shiplift.tasks.backends.interfaces import ComponentSpec, DeployPoll, RolloutResult, RolloutStep, StepKind
from shiplift.tasks.errors import Conflict
from shiplift.tasks.ledger.events import (
    BAKE,
    DONE,
    PROMOTE,
    REPLACED,
    ROLLED_BACK,
    ROLLOUT,
    SKIPPED,
    STEP,
    SUCCEEDED,
    TRAFFIC,
    VERDICT,
)
from shiplift.tasks.ledger.records import StepRecord, promotion
from shiplift.tasks.ledger.stage_results import PromoteResult
from shiplift.tasks.ledger.views import rollout_steps, step_key
from shiplift.tasks.pipeline.approval import awaits_person, blocked_reason
from shiplift.tasks.pipeline.bake import BakeWatch, live_summary
from shiplift.tasks.pipeline.release import latest_move, moved_config
from shiplift.tasks.pipeline.stages.common import (
    component_spec,
    production_component,
    production_endpoint,
    require_production_here,
    require_served,
)
from shiplift.validation.online_gate import OnlineGate

RECORDED = ((TRAFFIC, STEP), (BAKE, VERDICT))


def attempt_records(records: list) -> list:
    """The records of the promote run under way: those after the release's last promote record that ended one. A rerun
    after a crash continues the same attempt; a later promotion or rollback to the release starts a new one."""
    last = max((i for i, r in enumerate(records) if r.stage == PROMOTE and r.event in DONE), default=-1)
    return records[last + 1:]


class TrafficLog:
    """The rollout's ledger records, appended the moment the hosting tells each step (`OnStep`): a traffic record once
    a step's copies moved (with the release it moves from and what the backend describes as serving then), a verdict
    record once its bake judged it (alarm states, the online gate's evidence, the alarm). The ledger stamps each as it
    is appended, so its time is when the step was observed.

    A rerun of a promote that stopped mid-rollout continues its attempt: a record the attempt holds already (the same
    kind, phase and batch or check) is not appended again, and SageMaker's checks, which a followed update counts from 1
    again, are numbered on from the last one recorded. Steps a hosting returned without telling them are appended
    when the rollout returns (`catch_up`), late rather than lost."""

    def __init__(self, ctx, *, endpoint: str, component: str, strategy: str, bake: BakeWatch, describe):
        self.ctx, self.bake, self.describe = ctx, bake, describe
        self.where = {"endpoint": endpoint, "component": component, "strategy": strategy}
        earlier = [r for r in attempt_records(ctx.state.records) if (r.stage, r.event) in RECORDED]
        self.recorded = {(r.stage, *step_key(r.payload)) for r in earlier}
        self.check_offset = max((StepRecord.of(r).check or 0 for r in earlier), default=0)
        first = next((StepRecord.of(r) for r in earlier if r.stage == TRAFFIC), None)
        if first is not None:
            self.from_release = first.from_release
        else:
            served = ctx.backends.ledger.served_at(ctx.config.name, datetime.now(UTC))
            self.from_release = served.release_id if served else None

    def _numbered(self, step: RolloutStep) -> RolloutStep:
        return step if step.check is None else step.model_copy(update={"check": step.check + self.check_offset})

    def __call__(self, kind: StepKind, step: RolloutStep) -> None:
        told, step = step.key(), self._numbered(step)
        stage = TRAFFIC if kind == "shifted" else BAKE
        key = (stage, *step.key())
        if key in self.recorded:
            self.ctx.say(f"promote: the {stage} record of {step.phase} {step.batch or step.check} is in the ledger "
                         "already (an earlier attempt); not appended again")
            return
        fields = step.model_dump()
        if kind == "shifted":
            self.ctx.record(TRAFFIC, STEP, {**self.where, "from_release": self.from_release, **fields,
                                            "live": live_summary(self.describe())})
        else:
            evidence = {name: value for name, value in self.bake.evidence.get(told, {}).items() if name != "live"}
            self.ctx.record(BAKE, VERDICT,
                            {**self.where, **{name: fields[name] for name in ("phase", "batch", "check", "batches")},
                                            "alarm_states": fields["alarm_states"], **evidence, "alarm": step.alarm})
        self.recorded.add(key)

    def catch_up(self, steps) -> None:
        """Append what the rollout returned and never told (a hosting that does not call `on_step`): late, not lost."""
        for step in steps:
            numbered = self._numbered(step).key()
            if (TRAFFIC, *numbered) not in self.recorded:
                self("shifted", step)
            if step.key() in self.bake.evidence and (BAKE, *numbered) not in self.recorded:
                self("baked", step)

    def steps(self) -> list[dict]:
        """Every step of this attempt as the ledger holds it, each with its verdict
        (`tasks.ledger.views.rollout_steps`)."""
        return rollout_steps(attempt_records(self.ctx.state.records))


def online_gate(ctx, endpoint: str, component: str, spec: ComponentSpec):
    """The config's online gate over the live production component, or None when the rollout has none: the candidate's
    answers told apart by its spec's serving id, and a gate that has not decided following the release's
    `validation.inconclusive.choice` (block where the release names none; its extension is more canary rounds,
    `rollout.online_gate.extend_rounds`)."""
    gate = ctx.config.rollout.online_gate
    if gate is None:
        return None
    validation = ctx.config.validation
    invoker = ctx.backends.hosting.invoker(endpoint, component, timeout_s=validation.request_timeout_s)
    built = ctx.family.online_gate(invoker, validation, gate, config_dir=ctx.config_dir,
                                   candidate_model_sha256=ctx.result("build").model_sha256)
    if not isinstance(built, OnlineGate):
        return built  # a dry run's stand-in
    return dataclasses.replace(built, candidate_serving_id=spec.serving_id(),
                               inconclusive=validation.inconclusive.choice,
                               extend_rounds=gate.extend_rounds)


def watch(ctx, config, endpoint: str, component: str, spec: ComponentSpec) -> tuple[BakeWatch, TrafficLog]:
    """The rollout's bake (its alarms and the online gate over the live component) and its ledger log."""
    hosting, rollout = ctx.backends.hosting, config.rollout
    plan = rollout.plan()
    bake = BakeWatch(ctx.backends.metrics, endpoint, component, spec.sha256(), plan.alarms, plan.wait_interval_s,
                     online_gate=online_gate(ctx, endpoint, component, spec))
    log = TrafficLog(ctx, endpoint=endpoint, component=component, strategy=rollout.strategy, bake=bake,
                     describe=lambda: hosting.describe(endpoint, component))
    return bake, log


def first_release_unbaked(records: list) -> bool:
    """Whether this promote attempt started a first release's bake that never ended (the run stopped during it): the
    rerun bakes it again rather than find the copies serving and call them promoted."""
    return any((s["phase"], s["batches"], s["old_copies"]) == ("rollout", 1, 0) and "baked_at" not in s
               for s in rollout_steps(attempt_records(records)))


def first_release(ctx, config, endpoint: str, component: str, spec: ComponentSpec) -> tuple[RolloutResult, TrafficLog]:
    """A canary or linear release onto nothing: no champion serves, so every copy starts at once and then bakes as one
    step, under the bake alarms and the online gate (candidate-only: the absolute thresholds, no champion to compare).
    One that fails live is taken out of service (its component deleted), so nothing serves: `withdrawn`, with why."""
    hosting = ctx.backends.hosting
    ctx.say(f"promote: first release onto {endpoint}/{component}: all {spec.copies} copies start, "
            "then bake as one step")
    hosting.deploy(endpoint, component, spec, config.placement, role="production", progress=ctx.say)
    bake, log = watch(ctx, config, endpoint, component, spec)
    step = RolloutStep(phase="rollout", batch=1, batches=1, old_copies=0, new_copies=spec.copies,
                       new_spec_sha256=spec.sha256())
    log("shifted", step)
    baked = step.model_copy(update={"alarm": bake(step)})
    log("baked", baked)
    if not baked.alarm:
        return RolloutResult(status="created", steps=(baked,)), log
    ctx.say(f"promote: the first release failed live ({baked.alarm}); taking {endpoint}/{component} out of service")
    hosting.delete_component(endpoint, component, progress=ctx.say)
    out = RolloutStep(phase="rollback", batch=1, batches=1, old_copies=0, new_copies=0, new_spec_sha256=spec.sha256())
    log("shifted", out)
    reason = (f"{baked.alarm}; the first release was taken out of service ({endpoint}/{component} deleted): "
              "nothing serves")
    return RolloutResult(status="withdrawn", reason=reason, steps=(baked, out)), log


@dataclasses.dataclass(frozen=True)
class Target:
    """What a promote puts where: the config (as a fleet move placed it), production's endpoint and component, the spec,
    and the fleet move's promotion record (None without one)."""

    config: Any
    endpoint: str
    component: str
    spec: ComponentSpec
    moved: Any


def skip_reason(ctx) -> str | None:
    """Why this promote changes nothing (a gate that did not pass and asks no person, a required approval not given),
    or None."""
    validate = ctx.result("validate")
    if not awaits_person(validate, ctx.config):  # a pass, or an inconclusive gate a person was asked to decide
        return f"gate decision {validate.decision}"
    return blocked_reason(ctx)  # Conflict while a required approval is still awaited


def target(ctx) -> Target:
    """Where the release goes: production of its config, or of the layout a fleet move put it on; Conflict when
    production serves from another layout (`require_production_here`)."""
    move = latest_move(ctx.state.records)
    moved = promotion(move) if move is not None else None
    config = moved_config(ctx.config, moved.moved_to) if moved is not None else ctx.config  # where a fleet move put it
    # a promotion or rollback across a layout change would leave the old copies serving
    require_production_here(ctx.backends.ledger, config, ctx.release_id)
    return Target(config, production_endpoint(config), production_component(config),
                  component_spec(ctx, config, copies=config.rollout.copies), moved)


def replaced(ctx, at: Target):
    """The ledger's keeper of what the backend's update replaces (`Hosting.roll_out`'s `keep`), and what this attempt
    recorded of it before (its `previous`; None if nothing)."""
    def keep(previous: dict) -> None:
        ctx.record(ROLLOUT, REPLACED, {"endpoint": at.endpoint, "component": at.component, "previous": previous})

    kept = [r for r in attempt_records(ctx.state.records) if (r.stage, r.event) == (ROLLOUT, REPLACED)]
    return keep, (kept[-1].payload["previous"] if kept else None)


def rolls(ctx, at: Target) -> bool:
    """Whether this promote is a rolling update of a component that serves (canary or linear, no first release)."""
    return (at.config.rollout.strategy != "all_at_once"
            and ctx.backends.hosting.describe(at.endpoint, at.component) is not None
            and not first_release_unbaked(ctx.state.records))


def start(ctx) -> dict:
    """The deferred promote's start (the table's `defers`): send production's update and return at once. A rolling
    update is sent as the backend carries it on alone (`Hosting.start_roll_out`: SageMaker's, what it replaces kept in
    the ledger first), all_at_once as a deploy's start (`Hosting.start_deploy`); a skipped promote and a first
    release (deployed, then baked, by the stage itself) start nothing."""
    if skip_reason(ctx) is not None:
        return {"sent": False}
    at, hosting = target(ctx), ctx.backends.hosting
    rollout = at.config.rollout
    if rollout.strategy == "all_at_once":
        hosting.start_deploy(at.endpoint, at.component, at.spec, at.config.placement, role="production",
                             progress=ctx.say)
        return {"endpoint": at.endpoint, "component": at.component, "sent": True}
    if not rolls(ctx, at):
        return {"endpoint": at.endpoint, "component": at.component, "sent": False}
    keep, _ = replaced(ctx, at)
    sent = hosting.start_roll_out(at.endpoint, at.component, at.spec, at.config.placement, rollout.plan(),
                                  progress=ctx.say, keep=keep)
    return {"endpoint": at.endpoint, "component": at.component, "sent": sent}


def poll(ctx) -> DeployPoll:
    """The deferred promote's poll: one look at what `start` sent. A rolling update still running gets one check,
    baked and recorded as the stage records its checks (`TrafficLog`); done once it has ended (the stage then
    follows it: its last verdict, a rollback, a failure)."""
    if skip_reason(ctx) is not None:
        return DeployPoll(in_service=True, status="promote changes nothing: no wait")
    at, hosting = target(ctx), ctx.backends.hosting
    if at.config.rollout.strategy == "all_at_once":
        return hosting.poll_deploy(at.endpoint, at.component, at.spec, at.config.placement, role="production",
                                   progress=ctx.say)
    bake, log = watch(ctx, at.config, at.endpoint, at.component, at.spec)
    return hosting.poll_roll_out(at.endpoint, at.component, at.spec, at.config.rollout.plan(), bake,
                                 progress=ctx.say, on_step=log)


def run(ctx) -> dict:
    skipped = skip_reason(ctx)
    if skipped is not None:
        ctx.say(f"promote: skipped, {skipped}; the champion keeps serving")
        return PromoteResult(event=SKIPPED, reason=skipped, decision=ctx.result("validate").decision)
    at = target(ctx)
    config, endpoint, component, spec, moved = at.config, at.endpoint, at.component, at.spec, at.moved
    rollout, hosting = config.rollout, ctx.backends.hosting
    ctx.say(f"promote: {rollout.strategy} to {endpoint}/{component}")
    steps: list[dict] = []
    ctx.require_lease()  # the last moment before production changes: a run that lost the model's lease stops here
    if rollout.strategy == "all_at_once":
        live = hosting.deploy(endpoint, component, spec, config.placement, role="production", progress=ctx.say)
    else:
        if not rolls(ctx, at):
            outcome, log = first_release(ctx, config, endpoint, component, spec)
        else:
            bake, log = watch(ctx, config, endpoint, component, spec)
            keep, previous = replaced(ctx, at)
            outcome = hosting.roll_out(endpoint, component, spec, config.placement, rollout.plan(), bake,
                                       progress=ctx.say, on_step=log, previous=previous, keep=keep)
        log.catch_up(outcome.steps)
        steps = log.steps()
        live = hosting.describe(endpoint, component)
        if outcome.status == "withdrawn":
            ctx.say(f"promote: {outcome.reason}")
            return PromoteResult(event=ROLLED_BACK, reason=outcome.reason, endpoint=endpoint, component=component,
                                 strategy=rollout.strategy, steps=steps, served=None)
        if outcome.status == "rolled_back":
            if live is None or live.model_ref == spec.model_ref:
                raise Conflict(f"the rollout of {endpoint}/{component} was rolled back ({outcome.reason}) but the "
                               "previous model is not seen serving", fix="inspect the endpoint and roll back by hand")
            ctx.say(f"promote: rolled back: {outcome.reason}; the champion serves again")
            return PromoteResult(event=ROLLED_BACK, reason=outcome.reason, endpoint=endpoint, component=component,
                                 strategy=rollout.strategy, steps=steps,
                                 served=live.model_ref.model_dump() if live.model_ref else None)
        if live is None:
            raise Conflict(f"{endpoint}/{component} is gone right after its rollout", fix="rerun the promote stage")
    require_served(live, spec, where=f"production {endpoint}/{component} after promotion")
    if config.scale_to_zero is not None:
        hosting.enable_scale_to_zero(endpoint, component, config.scale_to_zero.plan(rollout.copies), progress=ctx.say)
    return PromoteResult(
        event=SUCCEEDED, endpoint=endpoint, component=component, strategy=rollout.strategy, steps=steps,
        served=live.model_ref.model_dump() if live.model_ref else spec.model_ref.model_dump(), copies=live.copies,
        placement=live.placement.model_dump(mode="json"), image_digest=live.image_digest,
        **({"share": moved.share} if moved is not None and moved.share else {}),
    )
