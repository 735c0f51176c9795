"""Triggered promotion and rollback (DESIGN §9): put a gated release, or an earlier one, on production.

Both run under the model's promotion lease, reuse the promote stage (`tasks.pipeline.stages.promote.run`)
to switch the production component and check the live spec, and append ledger records with
the reason and the actor. A rollback is recorded as a succeeded promotion of the earlier release
(payload `rollback_reason`, `rollback_from`, `rollback_to`), so `Ledger.served_at` reports it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shiplift.tasks.config import BLUE_GREEN_REFUSED
from shiplift.tasks.errors import BadInput, ConfigError, Conflict, GateFailed, NotFound
from shiplift.tasks.ledger.events import PROMOTE, SUCCEEDED
from shiplift.tasks.ledger.records import entry_result, is_promotion
from shiplift.tasks.ledger.stage_results import ValidateResult
from shiplift.tasks.pipeline.approval import awaits_person, blocked_reason
from shiplift.tasks.pipeline.release import StageContext, finish, holding_lease, reopen_release, run_stage
from shiplift.tasks.pipeline.stages.promote import run as promote_run

STRATEGIES = ("all_at_once", "canary", "linear")
RELEASE_ID_PATTERN = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?-[0-9a-f]{12}$"


def _require_text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"{name} must be a non-empty string, got {value!r}", fix=f"give a {name}")
    return value.strip()


def _require_release_id(name: str, value: Any) -> str:
    if not isinstance(value, str) or not re.match(RELEASE_ID_PATTERN, value):
        raise BadInput(
            f"{name} {value!r} is not a release id (<model name>-<12 hex digits of the config hash>)",
            fix="copy it from `shiplift ledger history` or the refresh DAG's begin task",
        )
    return value


def _switch_production(ctx: StageContext) -> dict:
    """Put this release on the production component and verify the live spec (the promote stage's code)."""
    result = promote_run(ctx)
    if result.event != SUCCEEDED:
        raise GateFailed(
            f"release {ctx.release_id} was not put on production: {result.reason}",
            fix="only a release whose gate decision is pass can serve",
        )
    return result


def promote(state_dir: str | Path | None, release_id: str, *, strategy: str | None, reason: str, actor: str,
            ledger_url: str | None = None, session: Any = None) -> dict:
    """Promote a release whose gate passed onto the production component, under the model's lease, with its own
    rollout (`strategy`, when given, must name it).

    The ledger is found at `ledger_url` ($SHIPLIFT_LEDGER_URL), else as SQLite under `state_dir`."""
    _require_release_id("release_id", release_id)
    reason, actor = _require_text("reason", reason), _require_text("actor", actor)
    if strategy == "blue_green":
        raise ConfigError(BLUE_GREEN_REFUSED, fix="promote with strategy all_at_once, canary or linear")
    if strategy is not None and strategy not in STRATEGIES:
        raise BadInput(f"strategy {strategy!r} is unknown", fix=f"use one of {', '.join(STRATEGIES)}")
    ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor, session=session)
    strategy = strategy or ctx.config.rollout.strategy
    if strategy != ctx.config.rollout.strategy:
        raise ConfigError(
            f"release {release_id} rolls out as its config says (rollout.strategy {ctx.config.rollout.strategy}), not "
            f"{strategy}: the release id is the config's hash, so its rollout (batches, bake, alarms) is part of what "
            "was gated and recorded",
            fix=f"promote with strategy {ctx.config.rollout.strategy}, or release a config whose rollout.strategy is "
                f"{strategy}",
        )
    validate = ctx.state.stage("validate")
    if validate["status"] != "succeeded":
        raise GateFailed(
            f"release {release_id} has no gate decision: its validate stage is {validate['status']}",
            fix="run the release (refresh DAG or `shiplift release`) through validate first",
        )
    gate = entry_result(validate, ValidateResult)
    if not awaits_person(gate, ctx.config):  # a pass, or an inconclusive gate its config asked a person to decide
        failed = "; ".join(gate.not_passed or [])
        raise GateFailed(
            f"release {release_id} cannot be promoted: its gate decision is {gate.decision!r}"
            + (f" ({failed})" if failed else ""),
            fix="promote a release whose gate decision is pass (or an inconclusive one an approver approved)",
        )
    refused = blocked_reason(ctx)  # Conflict while its approval is awaited
    if refused is not None:
        raise GateFailed(f"release {release_id} cannot be promoted: {refused}",
                         fix="promote a release an approver approved, or release it again")
    with holding_lease(ctx, actor):
        result = run_stage(ctx, PROMOTE, function=_switch_production,
                           extra={"reason": reason, "strategy": strategy, "trigger": "promote"})
        status = finish(ctx, failed=False)["status"]
    return {"release_id": release_id, "model": ctx.config.name, "action": "promote", "status": status,
            "strategy": strategy, "endpoint": result.endpoint, "component": result.component, "served": result.served}


def _promoted_releases(ledger, model: str) -> list[str]:
    return [r.release_id for r in ledger.history(model) if is_promotion(r)]


def rollback(
    state_dir: str | Path | None, model: str, target_release_id: str, *, reason: str, actor: str,
    expect_current: str | None = None, ledger_url: str | None = None, session: Any = None,
) -> dict:
    """Put an earlier, once-promoted release of `model` back on production and record why.

    `expect_current` (optional) guards against rolling back something other than what the
    caller saw serving: the rollback is refused when the ledger says another release serves.
    """
    _require_text("model", model)
    _require_release_id("target_release_id", target_release_id)
    if expect_current is not None:
        _require_release_id("expect_current", expect_current)
    reason, actor = _require_text("reason", reason), _require_text("actor", actor)
    ctx = reopen_release(target_release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor, session=session)
    if ctx.config.name != model:
        raise BadInput(
            f"release {target_release_id} belongs to model {ctx.config.name!r}, not {model!r}",
            fix=f"roll {model} back to one of its own releases",
        )
    ledger = ctx.backends.ledger
    if target_release_id not in _promoted_releases(ledger, model):
        raise NotFound(
            f"release {target_release_id} of {model} was never promoted (the ledger has no succeeded promotion of it)",
            fix=f"roll back to a release listed by `shiplift ledger history {model}` with a promote succeeded record",
        )
    with holding_lease(ctx, actor):
        served = ledger.served_at(model, datetime.now(UTC))
        current = served.release_id if served else None
        if expect_current is not None and current != expect_current:
            raise Conflict(
                f"the ledger says {current!r} serves {model}, not {expect_current!r}",
                fix="check `shiplift ledger history` and trigger the rollback with the release that serves now",
            )
        extra = {"rollback_reason": reason, "rollback_from": current, "rollback_to": target_release_id,
                 "trigger": "rollback"}
        result = run_stage(ctx, PROMOTE, function=_switch_production, extra=extra)
    return {"release_id": target_release_id, "model": model, "action": "rollback", "rollback_from": current,
            "rollback_to": target_release_id, "endpoint": result.endpoint, "component": result.component,
            "strategy": result.strategy, "steps": len(result.steps), "served": result.served}



