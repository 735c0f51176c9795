"""promote: put the gated candidate on the production component, then verify what actually serves."""

from __future__ import annotations

from tasks.errors import Conflict
from tasks.stages.candidate import extracted_model_dir, model_ref
from tasks.stages.common import production_endpoint, component_spec


def run(ctx) -> dict:
    decision = ctx.result("validate")["decision"]
    if decision != "pass":
        ctx.say(f"promote: skipped, gate decision is {decision}; the champion keeps serving")
        return {"event": "skipped", "reason": f"gate decision {decision}", "decision": decision}
    hosting = ctx.backends.hosting
    endpoint, component = production_endpoint(ctx), ctx.config.name
    spec = component_spec(ctx, extracted_model_dir(ctx), copies=ctx.config.rollout.copies, model_ref=model_ref(ctx))
    ctx.say(f"promote: {ctx.config.rollout.strategy} to {endpoint}/{component}")
    hosting.ensure_endpoint(endpoint)
    hosting.put_component(endpoint, component, spec)
    live = hosting.describe_endpoint(endpoint)["components"][component]
    if live["spec"]["model_ref"] != model_ref(ctx):
        raise Conflict(
            f"{endpoint}/{component} reports {live['spec']['model_ref']} after promotion, expected {model_ref(ctx)}",
            fix="inspect `shiplift endpoints list`; another process changed the endpoint",
        )
    return {
        "event": "succeeded",
        "endpoint": endpoint,
        "component": component,
        "url": hosting.endpoint_url(endpoint),
        "strategy": ctx.config.rollout.strategy,
        "served": live["spec"]["model_ref"],
        "copies": len(live.get("copies", [])),
    }
