"""promote: put the gated candidate on the production component, then verify what actually serves."""

from __future__ import annotations

from tasks.stages.common import component_spec, production_component, production_endpoint, require_served


def run(ctx) -> dict:
    decision = ctx.result("validate")["decision"]
    if decision != "pass":
        ctx.say(f"promote: skipped, gate decision is {decision}; the champion keeps serving")
        return {"event": "skipped", "reason": f"gate decision {decision}", "decision": decision}
    endpoint, component = production_endpoint(ctx.config), production_component(ctx.config)
    spec = component_spec(ctx, copies=ctx.config.rollout.copies)
    ctx.say(f"promote: {ctx.config.rollout.strategy} to {endpoint}/{component}")
    live = ctx.backends.hosting.deploy(endpoint, component, spec, ctx.config.placement, role="production", progress=ctx.say)
    require_served(live, spec, where=f"production {endpoint}/{component} after promotion")
    return {
        "event": "succeeded",
        "endpoint": endpoint,
        "component": component,
        "strategy": ctx.config.rollout.strategy,
        "served": live.model_ref.model_dump() if live.model_ref else spec.model_ref.model_dump(),
        "copies": live.copies,
        "placement": live.placement.model_dump(mode="json"),
        "image_digest": live.image_digest,
    }
