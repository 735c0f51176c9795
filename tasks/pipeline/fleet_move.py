"""A shared endpoint's layout change (`shiplift fleet move`, docs/fleet.md): a running endpoint's instances and MIG
layout cannot change, so a new layout is a new endpoint (named by it: `tasks.pipeline.stages.common.layout_id`) and
every model on the old one moves to it.

From the configs of every model with its new placement: the new layout is planned (`tasks.pipeline.fleet`) and must
fit; then, one model at a time under its promotion lease, the release that serves it now (its champion: artifact,
image and environment as gated) starts on the new endpoint with the new placement's copies and answers a request, and
the move is recorded in its history as a promotion of that release (trigger `move`, `moved_from` the old endpoint and
component), so `status`, `served_at`, the audit and later releases all see the new endpoint. Once no model serves on
the old endpoint, it is deleted and that retirement recorded in every moved model's history, unless `keep_old` leaves
it serving for callers that have not switched yet (a rerun without it retires it).

Resumable: a model the ledger already shows on the new endpoint is not moved again, an endpoint already gone is not
deleted again, and a retirement already recorded is not recorded again; a run stopped halfway (a lease another run
holds, a copy that does not start) leaves every model serving, each on the endpoint its last record names.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tasks.backends.placement import MemoryEstimate, fit_problem
from tasks.config import load_release_config
from tasks.errors import ConfigError, DeployFailed
from tasks.ledger import events
from tasks.ledger.stage_results import PromoteResult
from tasks.pipeline.fleet import FleetPlan, plan_fleet, serves_on
from tasks.pipeline.release import Progress, holding_lease, print_progress, reopen_release, run_holder, run_stage
from tasks.pipeline.stages.common import component_spec, compute, production_component, production_endpoint, require_served

@dataclass(frozen=True)
class Moved:
    """What happened to one model: `moved` (from `old`), `here` already, or `unreleased` (it joins at its first release)."""

    model: str
    outcome: str
    release_id: str | None = None
    old: str | None = None
    first_answer_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "outcome": self.outcome, "release_id": self.release_id, "from": self.old,
                "first_answer_s": self.first_answer_s}


def move_fleet(config_paths: list[str | Path], *, reason: str, actor: str, overrides: tuple[str, ...] = (),
               keep_old: bool = False, progress: Progress = print_progress, session: Any = None) -> dict[str, Any]:
    """Move every model of a shared endpoint onto the endpoint of the configs' (new) placement, recording each move,
    then retire the endpoints no model serves on any more (unless `keep_old`). ConfigError, before anything changes,
    when the new layout does not fit or a model serving on an old endpoint is missing from the configs."""
    from tasks.backends.registry import make_backends

    if not reason.strip():
        raise ConfigError("a fleet move needs its reason", fix="pass --reason TEXT: why the layout changes, for the ledger")
    _fitting_plan(config_paths, None, overrides)  # the layout's own arithmetic, before a state dir or ledger is made
    configs = [load_release_config(path, overrides=overrides) for path in config_paths]
    backends = make_backends(configs[0], session=session)
    ledger = backends.ledger
    plan = _fitting_plan(config_paths, ledger, overrides)  # and each copy's memory as its last build measured it
    _require_every_tenant(ledger, plan, {config.name for config in configs})
    _require_champions_fit(ledger, configs)
    where = {"ledger": ledger, "ledger_url": backends.ledger_url, "state_dir": backends.state_dir, "actor": actor,
             "progress": progress, "session": session}
    moved = [_move_model(config, plan, reason=reason, **where) for config in configs]
    old = sorted(_old_endpoints(ledger, plan))
    retired = [] if keep_old else [name for name in old if _retire(name, plan, backends.hosting, **where)]
    if backends.checkpoint is not None and (retired or any(m.outcome == "moved" for m in moved)):
        signed = backends.checkpoint()
        progress(f"fleet move: ledger checkpoint seq {signed.seq} signed by key {signed.key_id}")
    return {"group": plan.group, "endpoint": plan.endpoint, "models": [m.as_dict() for m in moved],
            "retired": retired, "kept": [name for name in old if name not in retired], "plan": plan.as_dict()}


def _fitting_plan(config_paths, ledger, overrides: tuple[str, ...]) -> FleetPlan:
    """The new layout's plan; ConfigError with its arithmetic when it does not fit."""
    plan = plan_fleet(config_paths, ledger=ledger, overrides=overrides)
    if plan.problems:
        raise ConfigError(f"the new layout of {plan.group} does not fit: " + "; ".join(plan.problems),
                          fix="change the configs until `shiplift fleet plan` shows the fleet fits, then move")
    return plan


def _require_every_tenant(ledger, plan: FleetPlan, named: set[str]) -> None:
    """ConfigError when a model the configs do not name serves on an endpoint the move leaves: the old endpoint could
    never be retired, and that model would stay on a layout its fleet left."""
    serving = _serving(ledger)
    leaving = {serving.get(model) for model in named} - {None, plan.endpoint}
    others = sorted(model for model, endpoint in serving.items() if model not in named and endpoint in leaving)
    if others:
        raise ConfigError(f"{', '.join(others)} also serve(s) on {', '.join(sorted(leaving))}, which the move leaves, "
                          "but no config of it was given", fix="pass the config of every model on the shared endpoint, "
                          "each with the new placement")


def _require_champions_fit(ledger, configs) -> None:
    """ConfigError when the release serving a model now needs more memory (as its build measured) than one copy has
    on the new placement: found before any model moves."""
    from tasks.ledger.release_state import ReleaseState

    problems = []
    for config in configs:
        served = ledger.served_at(config.name, datetime.now(timezone.utc))
        if served is None:
            continue
        memory = ReleaseState.load(ledger, served.release_id).result("build").memory
        problem = fit_problem(MemoryEstimate(memory.weights_mb, memory.context_mb, memory.runtime_mb, memory.context_label),
                              config.placement)
        if problem:
            problems.append(f"{config.name} (release {served.release_id}): {problem}")
    if problems:
        raise ConfigError("the releases serving now do not fit the new layout: " + "; ".join(problems),
                          fix="pick a placement their copies fit, or release smaller models onto the old layout first")


def _serving(ledger) -> dict[str, str | None]:
    """Every promoted model and the endpoint its newest promotion names (where the ledger says it serves now)."""
    return {model: serves_on(ledger, model) for model in
            {r.model for r in ledger.history() if (r.stage, r.event) == (events.PROMOTE, events.SUCCEEDED)}}


def _move_model(config, plan: FleetPlan, *, reason: str, ledger, ledger_url: str | None, state_dir: Path, actor: str,
                progress: Progress, session: Any) -> Moved:
    """Start the release serving `config.name` on the new endpoint and record it there, unless it already is."""
    served = ledger.served_at(config.name, datetime.now(timezone.utc))
    if served is None:
        progress(f"fleet move: {config.name} has never been promoted; its first release joins {plan.endpoint}")
        return Moved(config.name, "unreleased")
    old, old_component = served.payload.get("endpoint"), served.payload.get("component")
    if old == plan.endpoint:
        progress(f"fleet move: {config.name} ({served.release_id}) serves on {plan.endpoint} already")
        return Moved(config.name, "here", served.release_id)
    reopen = reopen_release(served.release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor,
                            progress=progress, session=session)
    target = reopen.config.model_copy(update={  # what serves stays the champion's; where and how many are the fleet's
        "placement": config.placement, "rollout": reopen.config.rollout.model_copy(update={"copies": config.rollout.copies}),
        "scale_to_zero": config.scale_to_zero})
    answered: list[float] = []
    extra = {"trigger": events.MOVE, "reason": reason, "moved_from": {"endpoint": old, "component": old_component}}
    with holding_lease(reopen, run_holder(actor)):
        run_stage(reopen, events.PROMOTE, extra=extra,
                  function=lambda ctx: _start_on_new_endpoint(ctx, target, plan, answered))
    return Moved(config.name, "moved", served.release_id, old, answered[0] if answered else None)


def _start_on_new_endpoint(ctx, target, plan: FleetPlan, answered: list[float]) -> PromoteResult:
    """The champion's component on the new endpoint, verified serving it and answering the gate's first request."""
    from validation.cold_start import first_answer

    memory = ctx.result("build").memory
    endpoint, component = production_endpoint(target), production_component(target)
    hosting = ctx.backends.hosting
    spec = component_spec(ctx, copies=target.rollout.copies).model_copy(
        update={"compute": compute(target, memory.total_mb)})
    ctx.say(f"fleet move: {component} onto {endpoint} ({target.rollout.copies} copies)")
    ctx.require_lease()
    live = hosting.deploy(endpoint, component, spec, target.placement, role="production", progress=ctx.say)
    require_served(live, spec, where=f"production {endpoint}/{component} after the move")
    validation = ctx.config.validation
    body = ctx.family.invocation_bodies(validation, validation.dataset_paths(ctx.config_dir))[0]
    invoker = hosting.invoker(endpoint, component, timeout_s=validation.request_timeout_s)
    start = first_answer(invoker, body, timeout_s=validation.request_timeout_s, deadline_s=4 * validation.request_timeout_s)
    if start.error:
        raise DeployFailed(f"{endpoint}/{component} serves {ctx.release_id} but did not answer the gate's first request: "
                           f"{start.error}", fix="read the copies' logs; the old endpoint still serves, rerun the move")
    answered.append(round(start.seconds, 3))
    ctx.say(f"fleet move: {endpoint}/{component} answered in {start.seconds:.2f} s ({start.attempts} attempt(s))")
    if target.scale_to_zero is not None:
        hosting.enable_scale_to_zero(endpoint, component, target.scale_to_zero.plan(target.rollout.copies), progress=ctx.say)
    share = next(t.share for t in plan.tenants if t.model == ctx.config.name)
    return PromoteResult(event=events.SUCCEEDED, endpoint=endpoint, component=component, strategy="all_at_once",
                         served=live.model_ref.model_dump() if live.model_ref else spec.model_ref.model_dump(),
                         copies=live.copies, placement=live.placement.model_dump(mode="json"),
                         image_digest=live.image_digest, share=share.as_dict())


def _old_endpoints(ledger, plan: FleetPlan) -> set[str]:
    """The endpoints the fleet's models were moved from (by this run or an earlier one) whose retirement is not
    recorded yet."""
    found = set()
    for tenant in plan.tenants:
        history = ledger.history(tenant.model)
        retired = {r.payload.get("endpoint") for r in history if (r.stage, r.event) == (events.FLEET, events.RETIRED)}
        found |= {r.payload["moved_from"]["endpoint"] for r in history
                  if (r.stage, r.event) == (events.PROMOTE, events.SUCCEEDED) and r.payload.get("trigger") == events.MOVE
                  and r.payload["moved_from"].get("endpoint") not in (None, plan.endpoint, *retired)}
    return found


def _retire(endpoint: str, plan: FleetPlan, hosting, *, ledger, ledger_url: str | None, state_dir: Path, actor: str,
            progress: Progress, session: Any) -> bool:
    """Delete an old endpoint no model serves on any more and record it in the history of each model moved from it;
    False (and nothing touched) while a model still serves there."""
    still = sorted(model for model, serving in _serving(ledger).items() if serving == endpoint)
    if still:
        progress(f"fleet move: {endpoint} is kept: {', '.join(still)} still serve(s) on it")
        return False
    if hosting.delete_endpoint(endpoint, progress=progress):
        progress(f"fleet move: retired {endpoint}")
    for tenant in plan.tenants:
        history = ledger.history(tenant.model)
        moves = [r for r in history if (r.stage, r.event) == (events.PROMOTE, events.SUCCEEDED)
                 and r.payload.get("trigger") == events.MOVE and r.payload["moved_from"].get("endpoint") == endpoint]
        recorded = any((r.stage, r.event, r.payload.get("endpoint")) == (events.FLEET, events.RETIRED, endpoint)
                       for r in history)
        if moves and not recorded:
            ctx = reopen_release(moves[-1].release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor,
                                 progress=progress, session=session)
            ctx.record(events.FLEET, events.RETIRED, {"endpoint": endpoint, "replaced_by": plan.endpoint})
    return True
