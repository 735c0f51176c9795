"""build: make the servable model and prove it, size it, then optionally fit a temperature.

GGUF: quantize or adopt, inspect, check the letter slots. ONNX: export, optimize, int8, and a
parity check against the PyTorch reference that stops the release when it fails. The memory one
copy needs (weights + KV cache or activations + runtime) is measured and checked against the
placement before anything is uploaded. The temperature is fitted by NLL on the calibration split,
scored by the same server the endpoint will run (on this worker), and recorded so the package
stage writes `calibration.json` into the artifact. The built model is kept in the artifact store.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.errors import ConfigError
from tasks.hashing import sha256_tree
from tasks.pipeline.stages.common import keep_file, keep_folder, local_ref, resource_name
from validation.evaluate import progress_counter


def run(ctx) -> dict:
    built = _build_onnx(ctx) if ctx.config.artifact.kind == "onnx" else _build_gguf(ctx)
    model_dir = Path(built.pop("model_dir"))
    memory = _memory(ctx, built, model_dir)
    result = {**built, "memory": {**memory._asdict(), "total_mb": memory.total_mb}, "temperature": 1.0, "calibration": None}
    if ctx.config.calibration.fit_temperature:
        result.update(_fit_temperature(ctx, model_dir, result["model_sha256"]))
    return result


def _memory(ctx, built: dict, model_dir: Path):
    """What one copy needs; ConfigError (before any upload) when it cannot fit the placement."""
    from tasks.backends.placement import fit_problem, gguf_memory, onnx_memory

    image = ctx.config.image
    if ctx.config.artifact.kind == "onnx":
        shape = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        estimate = onnx_memory(built["output"]["size"], max_batch=image.max_batch, max_len=image.max_len,
                               hidden=shape["hidden_size"], layers=shape["num_hidden_layers"], on_gpu=image.on_gpu)
    else:
        estimate = gguf_memory(built["output"]["size"], built["info"], context_tokens=image.max_tokens, on_gpu=image.on_gpu)
    problem = fit_problem(estimate, ctx.config.placement)
    if problem:
        raise ConfigError(f"build: {problem}", fix="change placement or image limits in the release config")
    ctx.say(f"build: one copy needs {estimate.describe()}")
    return estimate


def _build_gguf(ctx) -> dict:
    from tasks.artifacts.gguf import build_gguf

    artifact = ctx.config.artifact
    source = local_ref(ctx, ctx.result("resolve")["source_ref"])
    ctx.say(f"build: {'quantizing to ' + artifact.quantization if artifact.quantization else 'adopting'} {source.name}")
    built = build_gguf(
        source, ctx.backends.state_dir / "builds",
        quantization=artifact.quantization, allow_requantize=artifact.allow_requantize, threads=ctx.config.image.threads,
    ).to_dict()
    model_dir = ctx.stage_dir("build") / "model"
    model_dir.mkdir(exist_ok=True)
    link = model_dir / Path(built["path"]).name
    if not link.exists():
        link.symlink_to(built["path"])
    return {
        "output": keep_file(ctx, Path(built["path"]), Path(built["path"]).name),
        "gguf_sha256": built["sha256"],
        "model_dir": str(model_dir),
        "model_sha256": built["sha256"],
        "info": built["info"],
        "quantized_from": built.get("quantized_from"),
        "letter_tokens": built.get("letter_token_ids"),
    }


def _build_onnx(ctx) -> dict:
    from tasks.artifacts.onnx_export import export_onnx, parity_check, require_parity
    from validation.nli_eval import load_nli_dataset

    artifact = ctx.config.artifact
    source = ctx.result("resolve")
    checkpoint = local_ref(ctx, source["source_ref"])
    out = ctx.backends.state_dir / "builds" / f"{source['source_sha256'][:16]}-onnx-opset{artifact.opset}-len{artifact.max_len}{'-int8' if artifact.int8 else ''}"
    ctx.say(f"build: exporting {checkpoint.name} to ONNX (opset {artifact.opset}{', + dynamic int8' if artifact.int8 else ''})")
    exported = export_onnx(checkpoint, out, opset=artifact.opset, max_len=artifact.max_len, int8=artifact.int8,
                           threads=ctx.config.image.threads)
    rule = artifact.parity
    probe = load_nli_dataset(_data_path(ctx, rule.probe), name="parity-probe", splits=rule.probe.splits)
    ctx.say(f"build: parity against PyTorch on {len(probe.pairs)} probe pairs")
    report = parity_check(
        checkpoint, out, probe.pairs, max_abs_logit_delta=rule.max_abs_logit_delta,
        min_label_agreement=rule.min_label_agreement, int8_max_abs_logit_delta=rule.int8_max_abs_logit_delta,
        int8_min_label_agreement=rule.int8_min_label_agreement, max_len=artifact.max_len, threads=ctx.config.image.threads,
    )
    (ctx.stage_dir("build") / "parity.json").write_text(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    require_parity(report)
    return {
        "output": keep_folder(ctx, out, main_file="model.onnx"),
        "model_dir": str(out),
        "model_sha256": sha256_tree(out),
        "export": {k: v for k, v in exported.to_dict().items() if k != "model_dir"},
        "parity": report.to_dict(),
        "info": {"file_type": "int8+fp32" if artifact.int8 else "fp32", "model_type": exported.model_type},
        "probe_sha256": probe.sha256,
    }


def _data_path(ctx, ref) -> Path:
    from tasks.config import resolve_data_path

    return resolve_data_path(ref, ctx.config_dir)


def _calibration_predictions(ctx, invoker) -> tuple[list, str]:
    """Score the calibration split through the model's own server; returns predictions and the data digest."""
    settings = ctx.config.validation
    report = progress_counter(ctx.say, "calibration")
    if ctx.config.artifact.kind == "onnx":
        from validation.nli_eval import load_nli_dataset
        from validation.nli_runner import run_pairs

        ref = ctx.config.calibration.dataset
        dataset = load_nli_dataset(_data_path(ctx, ref), name="calibration", splits=ref.splits)
        run = run_pairs(invoker, dataset.pairs, batch_size=settings.batch_size, timeout_s=settings.request_timeout_s,
                        deadline_s=settings.deadline_s, dataset_name="calibration", progress=report)
        return run.predictions, dataset.sha256
    from validation.datasets import load_decision_dataset
    from validation.runner import run_decisions

    ref = ctx.config.calibration.dataset
    dataset = load_decision_dataset(_data_path(ctx, ref), name="calibration", splits=ref.splits)
    predictions = run_decisions(invoker, dataset.tasks, concurrency=settings.concurrency, timeout_s=settings.request_timeout_s,
                                deadline_s=settings.deadline_s, dataset_name="calibration", progress=report)
    return predictions, dataset.sha256


def _fit_temperature(ctx, model_dir: Path, model_sha256: str) -> dict:
    from validation.calibration import fit_temperature

    with ctx.backends.scratch.serve(ctx.config.image, model_dir, resource_name(ctx.config, "cal", model_sha256)) as invoker:
        predictions, data_sha256 = _calibration_predictions(ctx, invoker)
    usable = [p for p in predictions if not p.error and p.option_logits]
    fit = fit_temperature([p.option_logits for p in usable], [p.option_ids.index(p.expected) for p in usable])
    calibration = {
        "temperature": fit.temperature,
        "nll_before": fit.nll_before,
        "nll_after": fit.nll_after,
        "n": fit.n,
        "at_bound": fit.at_bound,
        "errors": len(predictions) - len(usable),
        "dataset_sha256": data_sha256,
        "model_sha256": model_sha256,
    }
    ctx.say(f"build: temperature {fit.temperature:.3f} (NLL {fit.nll_before:.3f} → {fit.nll_after:.3f} on {fit.n} examples)")
    if fit.at_bound:
        ctx.say(
            f"build: warning: the fit stopped at the search bound {fit.temperature:g}; the logits carry "
            "little information on this split, so the fitted model is close to uniform"
        )
    return {"temperature": fit.temperature, "calibration": calibration}
