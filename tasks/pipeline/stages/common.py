"""Names and component specs shared by the stages.

Names derive from content only (`<prefix>-<model>-<role>[-<hash>]`); the config guarantees they fit SageMaker's 63
characters. (Files a later stage needs go through the artifact store: `StageContext.keep_file`, `keep_folder` and
`local_ref`.)
"""

from __future__ import annotations

from datetime import UTC, datetime

from shiplift.tasks.backends.interfaces import ComponentSpec, Compute, ModelRef
from shiplift.tasks.errors import Conflict
from shiplift.tasks.hashing import sha256_json
from shiplift.tasks.ledger.events import FLEET, PROMOTE, RETIRED, SUCCEEDED
from shiplift.tasks.ledger.records import Retirement, promotion
from shiplift.tasks.ledger.views import left_by_fleet
from shiplift.tasks.pipeline.fleet.layout import layout_id


def resource_name(config, role: str, *content: str) -> str:
    base = f"{config.resource_prefix}-{config.name}-{role}"
    return f"{base}-{sha256_json(list(content))[:10]}" if content else base


def production_endpoint(config) -> str:
    """The model's own production endpoint, or the shared one its placement names, for that layout
    (`<prefix>-<endpoint>-<layout id>`)."""
    shared = config.placement.endpoint
    return f"{config.resource_prefix}-{shared}-{layout_id(config.placement)}" if shared else resource_name(config,
                                                                                                           "prod")


def production_component(config) -> str:
    """The production inference component: stable across releases, so promotion updates it in place. On a shared
    endpoint it carries the layout id too: component names are unique in an account and region, and a layout change
    starts the new endpoint's component beside the old one before the old goes."""
    own = f"{config.resource_prefix}-{config.name}"
    return f"{own}-{layout_id(config.placement)}" if config.placement.endpoint else own


def require_production_here(ledger, config, release_id: str) -> None:
    """Conflict when the ledger says the model serves on another production endpoint than this release's config names
    (its shared endpoint's layout changed, or it moved since the release was opened: a release there would gate
    against no champion and leave the old copies serving; the fleet moves first), or when a model that never served
    would join a shared endpoint a fleet move left (it would be stranded on the old layout, or bring a retired endpoint
    back)."""
    served = ledger.served_at(config.name, datetime.now(UTC))
    where = production_endpoint(config)
    serving_on = promotion(served).endpoint if served is not None else None
    if serving_on not in (None, where):
        raise Conflict(f"{config.name} serves on {serving_on} (release {served.release_id}), but release "
                       f"{release_id}'s config names production endpoint {where}: a running endpoint's layout cannot "
                       "change, so another placement is another endpoint",
                       fix="release a config with the placement the model serves with, or roll back to a release "
                           "serving there; a layout change moves every model of the shared endpoint first (`shiplift "
                           "fleet move CONFIG...`, each with its new config). A model cannot leave a shared endpoint "
                           "for its own yet (docs/fleet.md, Not yet)")
    if served is None and config.placement.endpoint:
        records = sorted(ledger.events(FLEET, RETIRED) + ledger.events(PROMOTE, SUCCEEDED), key=lambda r: r.seq)
        left = left_by_fleet(records, where)
        if left is not None:
            how = (f"retired (replaced by {Retirement.of(left).replaced_by})" if left.stage == FLEET else
                   f"left for {promotion(left).endpoint} (it serves on only for callers that have not switched)")
            raise Conflict(f"release {release_id}'s config names production endpoint {where}, which a fleet move "
                           f"{how}, recorded in release {left.release_id}",
                           fix="give the config the placement of the shared endpoint's current layout (`shiplift fleet "
                               "plan CONFIG...` shows where each model serves now)")


def candidate_name(config, artifact_sha256: str, image_digest: str) -> str:
    """The candidate endpoint (and its one component): named by the config, artifact and image it serves, so two
    releases of one artifact (another placement, other limits) never share a candidate."""
    return resource_name(config, "cand", config.config_hash(), artifact_sha256, image_digest)


def candidate_endpoint(ctx) -> str:
    return candidate_name(ctx.config, ctx.result("package").artifact_sha256, ctx.result("image").image_digest)


def model_ref(ctx) -> ModelRef:
    """What an endpoint serving this release must report: the ledger compares it with the live spec."""
    return ModelRef(release_id=ctx.release_id, artifact_sha256=ctx.result("package").artifact_sha256,
                    image_digest=ctx.result("image").image_digest)


def compute(config, memory_mb: int) -> Compute:
    """What one copy needs: a MIG partition, a whole GPU, or the image's CPU threads, and the memory the build
    measured."""
    placement, image = config.placement, config.image
    if placement.kind == "mig_partition":
        return Compute(memory_mb=memory_mb, accelerator_partition=placement.partition_type)
    if image.on_gpu:
        return Compute(memory_mb=memory_mb, accelerators=1)
    return Compute(memory_mb=memory_mb, cpu_cores=float(image.threads))


def require_served(live, spec: ComponentSpec, *, where: str) -> None:
    """Conflict unless the component is InService on exactly `spec` (an update that ended on the old spec fails
    here)."""
    differences = live.differences(spec)
    if differences or live.status != "InService":
        raise Conflict(
            f"{where} is {live.status} and does not serve the candidate: "
            + ("; ".join(differences) or "its status is not InService")
            + (f" (FailureReason: {live.failure_reason})" if live.failure_reason else ""),
            fix="inspect the endpoint (the backend's console or `shiplift cleanup CONFIG --list`); what served before "
                "still serves",
        )


def component_spec(ctx, config, *, copies: int) -> ComponentSpec:
    """The release's backend-neutral component, with `config`'s compute (the release's own, or the placement a fleet
    move gives it): pinned image, stored artifact, container environment (the image's, and what the build found the
    model needs: a chat template inferred from the GGUF's architecture)."""
    package, image, build = ctx.result("package"), ctx.result("image"), ctx.result("build")
    environment = {**config.image.container_env(), **getattr(build, "container_env", {})}
    return ComponentSpec(image_uri=image.image_uri, artifact_uri=package.artifact_uri,
                         artifact_sha256=package.artifact_sha256, environment=environment,
                         copies=copies, compute=compute(config, build.memory.total_mb),
                         model_ref=model_ref(ctx))
