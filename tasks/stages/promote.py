"""promote: put the gated candidate on the production component, then verify what actually serves."""

from __future__ import annotations

from tasks.errors import Conflict
from tasks.stages.common import component_spec, production_component, production_endpoint


def run(ctx) -> dict:
    decision = ctx.result("validate")["decision"]
    if decision != "pass":
        ctx.say(f"promote: skipped, gate decision is {decision}; the champion keeps serving")
        return {"event": "skipped", "reason": f"gate decision {decision}", "decision": decision}
    endpoint, component = production_endpoint(ctx.config), production_component(ctx.config)
    spec = component_spec(ctx, copies=ctx.config.rollout.copies)
    ctx.say(f"promote: {ctx.config.rollout.strategy} to {endpoint}/{component}")
    live = ctx.backends.hosting.deploy(endpoint, component, spec, ctx.config.placement, role="production", progress=ctx.say)
    differences = live.differences(spec)
    if differences or live.status != "InService":
        raise Conflict(
            f"{endpoint}/{component} is {live.status} after promotion and does not serve the candidate: "
            + ("; ".join(differences) or "its status is not InService"),
            fix="inspect the endpoint (shiplift endpoints list, or the SageMaker console); the champion may still serve",
        )
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
