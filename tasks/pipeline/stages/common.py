"""Names, component specs and stored files shared by the stages.

Names derive from content only (`<prefix>-<model>-<role>[-<hash>]`); the config guarantees
they fit SageMaker's 63 characters. A file a later stage needs is kept in the artifact store
(`keep_file`, `keep_folder`) and read back on whichever worker runs that stage (`local_file`,
`local_folder`), so no stage relies on another worker's disk.
"""

from __future__ import annotations

from pathlib import Path

from tasks.errors import Conflict
from tasks.hashing import sha256_json
from tasks.backends.interfaces import ComponentSpec, Compute, ModelRef
from tasks.pipeline.results import KeptRef

FOLDER_ARCHIVE = "folder.tar.gz"


def resource_name(config, role: str, *content: str) -> str:
    base = f"{config.resource_prefix}-{config.name}-{role}"
    return f"{base}-{sha256_json(list(content))[:10]}" if content else base


def production_endpoint(config) -> str:
    return resource_name(config, "prod")


def production_component(config) -> str:
    """The production inference component: stable across releases, so promotion updates it in place."""
    return f"{config.resource_prefix}-{config.name}"


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
    """What one copy needs: a MIG partition, a whole GPU, or the image's CPU threads, and the memory the build measured."""
    placement, image = config.placement, config.image
    if placement.kind == "mig_partition":
        return Compute(memory_mb=memory_mb, accelerator_partition=placement.partition_type)
    if image.on_gpu:
        return Compute(memory_mb=memory_mb, accelerators=1)
    return Compute(memory_mb=memory_mb, cpu_cores=float(image.threads))


def require_served(live, spec: ComponentSpec, *, where: str) -> None:
    """Conflict unless the component is InService on exactly `spec` (an update that ended on the old spec fails here)."""
    differences = live.differences(spec)
    if differences or live.status != "InService":
        raise Conflict(
            f"{where} is {live.status} and does not serve the candidate: " + ("; ".join(differences) or "its status is not InService")
            + (f" (FailureReason: {live.failure_reason})" if live.failure_reason else ""),
            fix="inspect the endpoint (the backend's console or `shiplift cleanup CONFIG --list`); what served before still serves",
        )


def component_spec(ctx, *, copies: int) -> ComponentSpec:
    """The release's backend-neutral component: pinned image, stored artifact, container environment."""
    package, image = ctx.result("package"), ctx.result("image")
    return ComponentSpec(image_uri=image.image_uri, artifact_uri=package.artifact_uri,
                         artifact_sha256=package.artifact_sha256, environment=ctx.config.image.container_env(),
                         copies=copies, compute=compute(ctx.config, ctx.result("build").memory.total_mb),
                         model_ref=model_ref(ctx))


def keep_file(ctx, path: Path, name: str) -> dict:
    """Put a file in the artifact store for later stages; returns its reference."""
    stored = ctx.backends.store.put_file(path, name=name, progress=ctx.say)
    return {"uri": stored.uri, "sha256": stored.sha256, "size": stored.size, "kind": "file"}


def keep_folder(ctx, folder: Path, *, main_file: str) -> dict:
    """Put a flat folder in the artifact store as one deterministic, manifest-checked archive."""
    from tasks.artifacts.packaging import package_model_dir

    archive = package_model_dir(folder, ctx.stage_dir("keep") / folder.name, manifest={"kept_from": folder.name},
                                model_file=main_file, archive_name=FOLDER_ARCHIVE)
    return {**keep_file(ctx, archive.path, FOLDER_ARCHIVE), "kind": "folder"}


def local_file(ctx, ref: KeptRef) -> Path:
    """A kept file on this worker, sha256-verified (downloaded once when the store is remote)."""
    return ctx.backends.store.get(ref.uri)


def local_folder(ctx, ref: KeptRef) -> Path:
    """A kept folder on this worker, extracted once per archive sha256 (safe extraction, manifest verified)."""
    from tasks.artifacts.packaging import safe_extract

    target = ctx.backends.state_dir / "unpacked" / ref.sha256
    if not target.is_dir():
        safe_extract(local_file(ctx, ref), target)
    return target


def local_ref(ctx, ref: KeptRef) -> Path:
    """A kept file or folder on this worker."""
    return local_folder(ctx, ref) if ref.kind == "folder" else local_file(ctx, ref)
