"""promote: put the gated candidate on the production component, then verify what actually serves.

`all_at_once` replaces every copy at once; `canary` and `linear` roll the component batch by batch
with a bake after each, judged by the config's bake alarms on the candidate's own answers and, when
the config has one, by the online gate (the canary set replayed through the live component). A
rollout an alarm stopped ends `rolled_back` with the alarm as its reason, once the previous model is
seen serving again. Every traffic step gets its own ledger record (stage `traffic`): batch n of N (or
SageMaker's n-th check), copies of each spec, alarm states, the online gate's evidence and what the
backend described as serving after it.
"""

from __future__ import annotations

from tasks.ledger.events import ROLLED_BACK, SKIPPED, STEP, SUCCEEDED, TRAFFIC
from tasks.pipeline.results import PromoteResult
from tasks.errors import ConfigError, Conflict
from tasks.pipeline.bake import BakeWatch
from tasks.pipeline.approval import blocked_reason
from tasks.pipeline.stages.common import component_spec, production_component, production_endpoint, require_served



def online_gate(ctx, endpoint: str, component: str):
    """The config's online gate over the live production component, or None when the rollout has none."""
    gate = ctx.config.rollout.online_gate
    if gate is None:
        return None
    from tasks.config import resolve_data_path
    from validation.datasets import load_decision_dataset
    from validation.online_gate import OnlineGate

    cfg = ctx.config.validation
    tasks = [task for i, ref in enumerate(cfg.datasets)
             for task in load_decision_dataset(resolve_data_path(ref, ctx.config_dir), name=f"dataset{i}", splits=ref.splits).tasks
             if task.split == gate.split]
    if len(tasks) < cfg.champion.min_samples:
        raise ConfigError(f"rollout.online_gate.split {gate.split!r} holds {len(tasks)} tasks, fewer than "
                          f"validation.champion.min_samples ({cfg.champion.min_samples})",
                          fix="name a larger split, or lower min_samples")
    invoker = ctx.backends.hosting.invoker(endpoint, component, timeout_s=cfg.request_timeout_s)
    return OnlineGate(invoker, tasks[: gate.max_tasks], candidate_model_sha256=ctx.result("build").model_sha256,
                      thresholds=cfg.thresholds, champion_rule=cfg.champion, rounds=gate.rounds,
                      concurrency=gate.concurrency, timeout_s=cfg.request_timeout_s,
                      readout=ctx.config.family.readout(cfg), decision_rule=cfg.decision_rule)


def run(ctx) -> dict:
    decision = ctx.result("validate").decision
    if decision != "pass":
        ctx.say(f"promote: skipped, gate decision is {decision}; the champion keeps serving")
        return PromoteResult(event=SKIPPED, reason=f"gate decision {decision}", decision=decision)
    blocked = blocked_reason(ctx)  # Conflict while a required approval is still awaited
    if blocked is not None:
        ctx.say(f"promote: skipped, {blocked}; the champion keeps serving")
        return PromoteResult(event=SKIPPED, reason=blocked, decision=decision)
    endpoint, component = production_endpoint(ctx.config), production_component(ctx.config)
    rollout, hosting = ctx.config.rollout, ctx.backends.hosting
    spec = component_spec(ctx, copies=rollout.copies)
    ctx.say(f"promote: {rollout.strategy} to {endpoint}/{component}")
    steps: list[dict] = []
    ctx.require_lease()  # the last moment before production changes: a run that lost the model's lease stops here
    if rollout.strategy == "all_at_once":
        live = hosting.deploy(endpoint, component, spec, ctx.config.placement, role="production", progress=ctx.say)
    else:
        plan = rollout.plan()
        bake = BakeWatch(ctx.backends.metrics, endpoint, component, spec.sha256(), plan.alarms, plan.wait_interval_s,
                         online_gate=online_gate(ctx, endpoint, component) if hosting.describe(endpoint, component) else None,
                         describe=lambda: hosting.describe(endpoint, component))
        outcome = hosting.roll_out(endpoint, component, spec, ctx.config.placement, plan, bake, progress=ctx.say)
        steps = bake.steps_with_evidence(outcome.steps)
        for step in steps:
            ctx.record(TRAFFIC, STEP, {"endpoint": endpoint, "component": component, "strategy": rollout.strategy, **step})
        live = hosting.describe(endpoint, component)
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
    return PromoteResult(
        event=SUCCEEDED, endpoint=endpoint, component=component, strategy=rollout.strategy, steps=steps,
        served=live.model_ref.model_dump() if live.model_ref else spec.model_ref.model_dump(), copies=live.copies,
        placement=live.placement.model_dump(mode="json"), image_digest=live.image_digest,
    )
