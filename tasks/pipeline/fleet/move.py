"""A shared endpoint's layout change (`shiplift fleet move`, docs/fleet.md): a running endpoint's instances and MIG
layout cannot change, so a new layout is a new endpoint (named by it: `tasks.pipeline.fleet.layout.layout_id`) and
every model on the old one moves to it.

From the configs of every model with its new placement, read once with each model's history
(`tasks.pipeline.fleet.snapshot`): the new layout is planned (from what serves: each champion's image, which the move
starts, and the copies serving now, where larger than the configs') and must fit; then, one model at a time under its
promotion lease, the release that serves it now (its champion: artifact, image and environment as gated) starts on the
new endpoint with the new placement's copies and answers a request, and the move is recorded in its history as a
promotion of that release (trigger `move`, `moved_from` the old endpoint and component), so `status`, `served_at`, the
audit and later releases all see the new endpoint. The old endpoint keeps serving for callers that have not switched
to the new name; with `retire_old` (once they have), an old endpoint no model serves on any more is deleted and that
retirement recorded in the history of every model moved from it.

Resumable: a model the ledger already shows on the new endpoint is not moved again, an endpoint already gone is not
deleted again, and a retirement already recorded is not recorded again; a run stopped halfway (a lease another run
holds, a copy that does not start) leaves every model serving, each on the endpoint its last record names. What the
ledger says is read again only under a lease, where a concurrent run could have changed it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shiplift.tasks.backends.placement import MemoryEstimate, fit_problem, image_size_problem
from shiplift.tasks.backends.registry import make_backends
from shiplift.tasks.config import ReleaseConfig
from shiplift.tasks.errors import ConfigError, Conflict, DeployFailed
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.records import promotion
from shiplift.tasks.ledger.stage_results import PromoteResult
from shiplift.tasks.pipeline.fleet.plan import FleetPlan, plan_snapshot
from shiplift.tasks.pipeline.fleet.snapshot import (
    FleetConfig,
    FleetSnapshot,
    backend_place,
    load_fleet_configs,
    read_snapshot,
)
from shiplift.tasks.pipeline.release import (
    Progress,
    StageContext,
    holding_lease,
    latest_move,
    moved_config,
    print_progress,
    reopen_release,
    run_holder,
    run_stage,
)
from shiplift.tasks.pipeline.stages.common import (
    component_spec,
    production_component,
    production_endpoint,
    require_served,
)
from shiplift.validation import cold_start


@dataclass(frozen=True)
class Moved:
    """What happened to one model: `moved` (from `old`), `here` already, or `unreleased` (it joins at its first
    release)."""

    model: str
    outcome: str
    release_id: str | None = None
    old: str | None = None
    first_answer_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "outcome": self.outcome, "release_id": self.release_id, "from": self.old,
                "first_answer_s": self.first_answer_s}


@dataclass(frozen=True)
class Move:
    """One model to move: the release serving it (reopened), its config with the new placement, and where from."""

    ctx: StageContext
    target: ReleaseConfig
    moved_to: dict[str, Any]
    old: str
    old_component: str | None


def move_fleet(config_paths: list[str | Path], *, reason: str, actor: str, overrides: tuple[str, ...] = (),
               retire_old: bool = False, progress: Progress = print_progress, session: Any = None) -> dict[str, Any]:
    """Move every model of a shared endpoint onto the endpoint of the configs' (new) placement, recording each move;
    with `retire_old`, then delete the endpoints no model serves on any more (callers have switched). ConfigError,
    before any model moves, when the new layout does not fit, a model serving on the endpoints involved is missing
    from the configs, or a release serving now cannot serve with the new placement (memory, image size, prefix or
    backend)."""
    if not reason.strip():
        raise ConfigError("a fleet move needs its reason",
                          fix="pass --reason TEXT: why the layout changes, for the ledger")
    configs = load_fleet_configs(config_paths, overrides)
    unread = read_snapshot(configs)
    _fitting_plan(unread)  # the layout's own arithmetic, before a state dir or ledger is made
    backends = make_backends(configs[0].config, session=session)
    ledger = backends.ledger
    snapshot = read_snapshot(configs, ledger=ledger, open_hosting=lambda: backends.hosting, prices=unread.prices)
    plan = _fitting_plan(snapshot)  # from what serves: each champion's image, the copies serving now, memory per copy
    _require_every_tenant(_endpoints_served(ledger), plan, {fleet.name for fleet in configs})
    where = {"ledger_url": backends.ledger_url, "state_dir": backends.state_dir, "actor": actor, "progress": progress,
             "session": session}
    moves = _planned_moves(snapshot, plan, **where)
    moved: list[Moved] = []
    old: list[str] = []
    retired: list[str] = []
    before = ledger.head()
    try:
        for fleet in configs:
            outcome, snapshot = _move_model(fleet.name, moves.get(fleet.name), snapshot, plan, ledger, reason=reason,
                                            actor=actor, progress=progress)
            moved.append(outcome)
        old = list(snapshot.endpoints_left(plan.endpoint))
        for name in old if retire_old else ():
            if _retire(name, snapshot, plan, backends.hosting, ledger, **where):
                retired.append(name)
    finally:  # whatever the run appended is signed, also when a later step stopped it
        if backends.checkpoint is not None and _seq(ledger.head()) != _seq(before):
            signed = backends.checkpoint()
            progress(f"fleet move: ledger checkpoint seq {signed.seq} signed by key {signed.key_id}")
    return {"group": plan.group, "endpoint": plan.endpoint, "models": [m.as_dict() for m in moved],
            "retired": retired, "kept": [name for name in old if name not in retired], "plan": plan.as_dict()}


def _fitting_plan(snapshot: FleetSnapshot) -> FleetPlan:
    """The new layout's plan; ConfigError with its arithmetic when it does not fit."""
    plan = plan_snapshot(snapshot)
    if plan.problems:
        raise ConfigError(f"the new layout of {plan.group} does not fit: " + "; ".join(plan.problems),
                          fix="change the configs until `shiplift fleet plan` shows the fleet fits, then move")
    return plan


def _seq(record) -> int:
    return record.seq if record is not None else 0


def _endpoints_served(ledger) -> dict[str, str | None]:
    """Every promoted model (named in the configs or not) and the endpoint its newest promotion serves it on, from one
    read of every promotion in the ledger."""
    newest = {record.model: record for record in ledger.events(events.PROMOTE, events.SUCCEEDED)}  # oldest first
    return {model: promotion(record).endpoint for model, record in newest.items()}


def _require_every_tenant(endpoints: dict[str, str | None], plan: FleetPlan, named: set[str]) -> None:
    """ConfigError when a model the configs do not name serves on an endpoint the move leaves (the old endpoint could
    never be retired, and that model would stay on a layout its fleet left) or on the new one (the plan would not count
    its copies)."""
    involved = ({endpoints.get(model) for model in named} | {plan.endpoint}) - {None}
    others = sorted(f"{model} (on {on})" for model, on in endpoints.items() if model not in named and on in involved)
    if others:
        raise ConfigError(f"{', '.join(others)} also serve(s) on an endpoint the move leaves or joins, but no config "
                          "of it was given", fix="pass the config of every model on the shared endpoint, each with the "
                          "new placement")


def _planned_moves(snapshot: FleetSnapshot, plan: FleetPlan, **where) -> dict[str, Move]:
    """Each model serving elsewhere, its serving release reopened with the new placement (validated as a config);
    ConfigError naming every release that cannot serve there, before any model moves."""
    moves, problems = {}, []
    for fleet in snapshot.configs:
        config, serving = fleet.config, snapshot.serving_of(fleet.name)
        if serving is None or serving.endpoint == plan.endpoint:
            continue
        moved_to = {"placement": config.placement.model_dump(mode="json"), "copies": config.rollout.copies,
                    "scale_to_zero": config.scale_to_zero.model_dump(mode="json") if config.scale_to_zero else None}
        ctx = reopen_release(serving.release_id, **where)
        try:
            target = moved_config(ctx.config, moved_to)
        except ValueError as exc:  # pydantic's ValidationError: the champion's image or rollout cannot take it
            problems.append(f"{config.name} (release {serving.release_id}): {exc}")
            continue
        found = _cannot_serve(ctx, target, fleet, plan)
        if found:
            problems.append(f"{config.name} (release {serving.release_id}): {found}")
            continue
        moves[config.name] = Move(ctx, target, moved_to, serving.endpoint, serving.component)
    if problems:
        raise ConfigError("the releases serving now cannot serve with the new layout: " + "; ".join(problems),
                          fix="pick a placement they can serve with (and the prefix and backend they were released "
                              "with), or release new versions onto the old layout first")
    return moves


def _cannot_serve(ctx: StageContext, target: ReleaseConfig, fleet: FleetConfig, plan: FleetPlan) -> str | None:
    """Why the serving release, with the new placement, would not land on the plan's endpoint or not run there."""
    if production_endpoint(target) != plan.endpoint:
        return (f"with the new placement it would serve on {production_endpoint(target)}, not {plan.endpoint} (it was "
                f"released with resource_prefix {target.resource_prefix!r})")
    if backend_place(target) != backend_place(fleet.config):
        return (f"it was released on {backend_place(target)} (backend, region), the fleet is on "
                f"{backend_place(fleet.config)}")
    memory = ctx.result("build").memory
    return (fit_problem(MemoryEstimate(memory.weights_mb, memory.context_mb, memory.runtime_mb, memory.context_label),
                        target.placement)
            or image_size_problem(ctx.result("image").size_bytes, target.placement))


def _move_model(model: str, move: Move | None, snapshot: FleetSnapshot, plan: FleetPlan, ledger, *, reason: str,
                actor: str, progress: Progress) -> tuple[Moved, FleetSnapshot]:
    """Start the release serving `model` on the new endpoint and record it there, unless it already is; the snapshot
    with the move's record. What serves is read again under the model's lease, so a promotion that landed meanwhile
    stops the move."""
    if move is None:
        serving = snapshot.serving_of(model)
        if serving is None:
            progress(f"fleet move: {model} has never been promoted; its first release joins {plan.endpoint}")
            return Moved(model, "unreleased"), snapshot
        progress(f"fleet move: {model} ({serving.release_id}) serves on {plan.endpoint} already")
        return Moved(model, "here", serving.release_id), snapshot
    answered: list[float] = []
    extra = {"trigger": events.MOVE, "reason": reason, "moved_to": move.moved_to,
             "moved_from": {"endpoint": move.old, "component": move.old_component}}
    with holding_lease(move.ctx, run_holder(actor)):
        served = ledger.served_at(model, datetime.now(UTC))
        serves_on = promotion(served).endpoint
        if (served.release_id, serves_on) != (move.ctx.release_id, move.old):
            raise Conflict(f"{model} changed while the move started: {served.release_id} serves on {serves_on}, not "
                           f"{move.ctx.release_id} on {move.old}",
                           fix="rerun the move: it plans again from what serves now")
        run_stage(move.ctx, events.PROMOTE, extra=extra,
                  function=lambda ctx: _start_on_new_endpoint(ctx, move.target, plan, answered))
    return (Moved(model, "moved", move.ctx.release_id, move.old, answered[0] if answered else None),
            snapshot.after(model, latest_move(move.ctx.state.records)))


def _start_on_new_endpoint(ctx: StageContext, config: ReleaseConfig, plan: FleetPlan,
                           answered: list[float]) -> PromoteResult:
    """The champion's component on the new endpoint (`config`: its own with the new placement), verified serving it and
    answering the gate's first request."""
    hosting = ctx.backends.hosting
    endpoint, component = production_endpoint(config), production_component(config)
    spec = component_spec(ctx, config, copies=config.rollout.copies)
    ctx.say(f"fleet move: {component} onto {endpoint} ({config.rollout.copies} copies)")
    ctx.require_lease()
    live = hosting.deploy(endpoint, component, spec, config.placement, role="production", progress=ctx.say)
    require_served(live, spec, where=f"production {endpoint}/{component} after the move")
    validation = config.validation
    body = ctx.family.invocation_bodies(validation, validation.dataset_paths(ctx.config_dir))[0]
    invoker = hosting.invoker(endpoint, component, timeout_s=validation.request_timeout_s)
    timeout_s = validation.request_timeout_s
    start = cold_start.first_answer(invoker, body, timeout_s=timeout_s, deadline_s=4 * timeout_s)
    if start.error:
        raise DeployFailed(f"{endpoint}/{component} serves {ctx.release_id} but did not answer the gate's first "
                           f"request: {start.error}",
                           fix="read the copies' logs; the old endpoint still serves, rerun the move")
    answered.append(round(start.seconds, 3))
    ctx.say(f"fleet move: {endpoint}/{component} answered in {start.seconds:.2f} s ({start.attempts} attempt(s))")
    if config.scale_to_zero is not None:
        scaling = config.scale_to_zero.plan(config.rollout.copies)
        hosting.enable_scale_to_zero(endpoint, component, scaling, progress=ctx.say)
    share = next(t.share for t in plan.tenants if t.model == config.name)
    return PromoteResult(event=events.SUCCEEDED, endpoint=endpoint, component=component, strategy="all_at_once",
                         served=live.model_ref.model_dump() if live.model_ref else spec.model_ref.model_dump(),
                         copies=live.copies, placement=live.placement.model_dump(mode="json"),
                         image_digest=live.image_digest, share=share.as_dict())


def _retire(endpoint: str, snapshot: FleetSnapshot, plan: FleetPlan, hosting, ledger, **where) -> bool:
    """Delete an old endpoint no model serves on any more and record it in the history of each model moved from it,
    holding those models' leases throughout (taken before anything is deleted; what serves is read again under them);
    False, and nothing touched, while a model still serves there."""
    progress = where["progress"]
    pending = [move for tenant in plan.tenants
               if (move := snapshot.histories[tenant.model].endpoints_left.get(endpoint)) is not None]
    contexts = [reopen_release(move.release_id, **where) for move in pending]
    with contextlib.ExitStack() as leases:
        for ctx in contexts:
            leases.enter_context(holding_lease(ctx, run_holder(where["actor"])))
        still = sorted(model for model, on in _endpoints_served(ledger).items() if on == endpoint)
        if still:
            progress(f"fleet move: {endpoint} is kept: {', '.join(still)} still serve(s) on it")
            return False
        if hosting.delete_endpoint(endpoint, progress=progress):
            progress(f"fleet move: retired {endpoint}")
        for ctx in contexts:
            ctx.record(events.FLEET, events.RETIRED, {"endpoint": endpoint, "replaced_by": plan.endpoint})
    return True
