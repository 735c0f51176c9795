"""package: build the deterministic model.tar.gz (its layout and its build's manifest fields are the model family's) and
put it in the content-addressed store."""

from __future__ import annotations

import json
import sys
from importlib import metadata

from shiplift.tasks.ledger.stage_results import PackageResult


def tool_versions(distributions: tuple[str, ...]) -> dict:
    """This Python's version and the installed versions of shiplift and the family's tools (None: not installed)."""
    versions = {"python": sys.version.split()[0]}
    for dist in ("shiplift", *distributions):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def run(ctx) -> dict:
    family = ctx.family
    resolved, built = ctx.result("resolve"), ctx.result("build")
    manifest = {
        "release_id": ctx.release_id,
        "model": ctx.config.name,
        "kind": ctx.config.artifact.kind,
        "source": {"sha256": resolved.source_sha256, **resolved.source},
        "build": {"model_sha256": built.model_sha256, "info": built.info, **family.manifest_fields(built)},
        "temperature": built.temperature,
        "tools": tool_versions(family.tool_distributions),
    }
    out_dir = ctx.stage_dir("package")
    calibration = None
    if built.calibration:
        calibration = out_dir / "calibration.json"
        calibration.write_text(json.dumps(built.calibration, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    packaged = family.package(ctx.local_ref(built.output), out_dir, manifest, calibration)
    stored = ctx.backends.store.put_file(packaged.path, name="model.tar.gz", progress=ctx.say)
    ctx.say(f"package: {stored.uri} ({stored.size / 1e6:.1f} MB)")
    return PackageResult(artifact_uri=stored.uri, artifact_sha256=stored.sha256, size_bytes=stored.size)
