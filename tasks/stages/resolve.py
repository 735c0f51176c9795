"""resolve: fetch the pinned model source into the shared source cache and prove its sha256."""

from __future__ import annotations

from tasks.errors import IntegrityError
from tasks.hashing import sha256_file


def run(ctx) -> dict:
    source = ctx.config.artifact.source
    cache = ctx.backends.state_dir / "sources"
    cache.mkdir(parents=True, exist_ok=True)
    ctx.say(f"resolve: {source.kind} source, pinned sha256 {source.sha256[:12]}…")
    if source.kind == "generated":
        path, description = _generate(source, cache)
    else:
        from tasks.gguf import resolve_source

        resolved = resolve_source(source, cache)
        path, description = resolved.path, resolved.description
    return {"source_path": str(path), "source_sha256": source.sha256, "source": description}


def _generate(source, cache):
    from tasks.tinymodel import write_tiny_gguf

    path = cache / f"generated-{source.sha256[:16]}.gguf"
    if not path.is_file():
        write_tiny_gguf(path, seed=source.seed, dtype=source.dtype)
    actual = sha256_file(path)
    if actual != source.sha256:
        path.unlink()
        raise IntegrityError(
            f"generated tiny model (seed {source.seed}) has sha256 {actual}, config pins {source.sha256}",
            fix="the generator or its gguf version changed; regenerate the pin with `python -m tasks.tinymodel`",
        )
    return path, {"kind": "generated", "seed": source.seed, "dtype": source.dtype}
