"""package: build the deterministic model.tar.gz and put it in the content-addressed store."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path


def tool_versions() -> dict:
    versions = {"python": sys.version.split()[0]}
    for dist in ("shiplift", "llama-cpp-python", "gguf", "numpy"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def run(ctx) -> dict:
    from tasks.packaging import package_gguf

    resolved, built = ctx.result("resolve"), ctx.result("build")
    manifest = {
        "release_id": ctx.release_id,
        "model": ctx.config.name,
        "source": {"sha256": resolved["source_sha256"], **resolved["source"]},
        "gguf": {"sha256": built["gguf_sha256"], "file_type": built["info"].get("file_type"), "quantized_from": built["quantized_from"]},
        "temperature": built["temperature"],
        "tools": tool_versions(),
    }
    extra = {"calibration.json": Path(built["calibration_file"])} if built["calibration_file"] else None
    packaged = package_gguf(Path(built["gguf_path"]), ctx.stage_dir("package"), manifest=manifest, extra_files=extra)
    stored = ctx.backends.store.put_file(packaged.path, name="model.tar.gz")
    ctx.say(f"package: {stored.uri} ({stored.size / 1e6:.1f} MB)")
    return {"artifact_uri": stored.uri, "artifact_sha256": stored.sha256, "size_bytes": stored.size}
