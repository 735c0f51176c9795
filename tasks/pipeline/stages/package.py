"""package: build the deterministic model.tar.gz (GGUF or ONNX folder) and put it in the content-addressed store."""

from __future__ import annotations

import json
import os
import shutil
import sys
from importlib import metadata
from pathlib import Path

from tasks.pipeline.stages.common import local_ref


def tool_versions() -> dict:
    versions = {"python": sys.version.split()[0]}
    for dist in ("shiplift", "llama-cpp-python", "gguf", "numpy"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def run(ctx) -> dict:
    resolved, built = ctx.result("resolve"), ctx.result("build")
    manifest = {
        "release_id": ctx.release_id,
        "model": ctx.config.name,
        "kind": ctx.config.artifact.kind,
        "source": {"sha256": resolved["source_sha256"], **resolved["source"]},
        "build": {k: built.get(k) for k in ("model_sha256", "gguf_sha256", "quantized_from", "info", "export") if built.get(k) is not None},
        "temperature": built["temperature"],
        "tools": tool_versions(),
    }
    out_dir = ctx.stage_dir("package")
    calibration = None
    if built["calibration"]:
        calibration = out_dir / "calibration.json"
        calibration.write_text(json.dumps(built["calibration"], indent=2, sort_keys=True) + "\n", encoding="utf-8")
    model = local_ref(ctx, built["output"])
    if ctx.config.artifact.kind == "onnx":
        packaged = _package_onnx(model, out_dir, manifest, calibration)
    else:
        from tasks.artifacts.packaging import package_gguf

        extra = {"calibration.json": calibration} if calibration else None
        packaged = package_gguf(model, out_dir, manifest=manifest, extra_files=extra)
    stored = ctx.backends.store.put_file(packaged.path, name="model.tar.gz", progress=ctx.say)
    ctx.say(f"package: {stored.uri} ({stored.size / 1e6:.1f} MB)")
    return {"artifact_uri": stored.uri, "artifact_sha256": stored.sha256, "size_bytes": stored.size}


def _package_onnx(model_dir: Path, out_dir: Path, manifest: dict, calibration: Path | None):
    """The exported folder plus calibration.json, staged with hard links (never edits the build output)."""
    from tasks.artifacts.packaging import package_model_dir

    staging = out_dir / "staging"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    for path in sorted(model_dir.iterdir()):
        if path.is_file() and path.name != "model-manifest.json":
            os.link(path, staging / path.name)
    if calibration:
        shutil.copyfile(calibration, staging / "calibration.json")
    try:
        return package_model_dir(staging, out_dir, manifest=manifest, model_file="model.onnx")
    finally:
        shutil.rmtree(staging)
