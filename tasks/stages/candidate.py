"""deploy_candidate / teardown_candidate: a throw-away endpoint serving exactly the new artifact."""

from __future__ import annotations

from pathlib import Path

from tasks.stages.common import delete_endpoint_if_present, resource_name, component_spec

COMPONENT = "model"


def model_ref(ctx) -> dict:
    """What an endpoint serving this release must report: the ledger compares it with the live spec."""
    return {
        "release_id": ctx.release_id,
        "artifact_sha256": ctx.result("package")["artifact_sha256"],
        "image_digest": ctx.result("image")["image_digest"],
    }


def extracted_model_dir(ctx) -> Path:
    """Extract the stored artifact once into `models/<sha256>/` (safe extraction, verified)."""
    from tasks.packaging import safe_extract

    sha = ctx.result("package")["artifact_sha256"]
    target = ctx.backends.state_dir / "models" / sha
    if not target.is_dir():
        archive = ctx.backends.store.get(ctx.result("package")["artifact_uri"])
        safe_extract(archive, target)
    return target


def candidate_name(ctx) -> str:
    return resource_name(ctx, "cand", ctx.result("package")["artifact_sha256"], ctx.result("image")["image_digest"])


def deploy(ctx) -> dict:
    hosting = ctx.backends.hosting
    name = candidate_name(ctx)
    spec = component_spec(ctx, extracted_model_dir(ctx), copies=1, model_ref=model_ref(ctx))
    ctx.say(f"deploy_candidate: endpoint {name}")
    hosting.ensure_endpoint(name)
    hosting.put_component(name, COMPONENT, spec)
    return {
        "endpoint": name,
        "component": COMPONENT,
        "url": hosting.endpoint_url(name),
        "placement": {"kind": "local-process", "requested": ctx.config.placement.kind, "copies": 1},
        "model_ref": model_ref(ctx),
    }


def teardown(ctx) -> dict:
    """Remove the candidate whatever happened; a release that has not finished redeploys it on resume."""
    if ctx.state.stage("deploy_candidate").get("status") in (None, "torn_down"):
        return {"event": "skipped", "reason": "no candidate is deployed"}
    name = candidate_name(ctx)
    keep = ctx.state.data.get("keep_candidate", ctx.config.keep_candidate)
    if keep:
        ctx.say(f"teardown_candidate: keeping {name} as asked")
        return {"endpoint": name, "event": "kept"}
    removed = delete_endpoint_if_present(ctx.backends.hosting, name)
    if ctx.state.stage("promote").get("status") != "succeeded":
        ctx.state.mark("deploy_candidate", "torn_down")
    return {"endpoint": name, "removed": removed}
