"""resolve: fetch the pinned model source, prove what it is, and keep it in the artifact store for build.

How a source is fetched and proven is the model family's (`tasks.families`); this stage keeps the result.
"""

from __future__ import annotations

from shiplift.tasks.ledger.stage_results import ResolveResult


def run(ctx) -> dict:
    family = ctx.family
    cache = ctx.backends.state_dir / "sources"
    cache.mkdir(parents=True, exist_ok=True)
    ctx.say(f"resolve: the {ctx.config.artifact.kind} artifact's pinned source")
    path, sha, description = family.resolve(ctx, cache)
    ctx.say(f"resolve: {description.get('kind', 'the')} source proven, sha256 {sha[:12]}…")
    kept = ctx.keep_folder(path, main_file=family.source_main_file) if path.is_dir() else ctx.keep_file(path, path.name)
    return ResolveResult(source_sha256=sha, source=description, source_ref=kept)
