"""build: make the servable model and prove it, then optionally fit a temperature.

GGUF: quantize or adopt, inspect, check the letter slots. ONNX: export, optimize, int8, and a
parity check against the PyTorch reference that stops the release when it fails. The
temperature is fitted by NLL on the calibration split, scored by the same server the endpoint
will run, and written to `calibration.json` so it travels inside the artifact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tasks.hashing import sha256_tree
from tasks.stages.common import component_spec, resource_name, temporary_endpoint
from validation.evaluate import progress_counter


def run(ctx) -> dict:
    result = _build_onnx(ctx) if ctx.config.artifact.kind == "onnx" else _build_gguf(ctx)
    result.update(temperature=1.0, calibration_file=None)
    if ctx.config.calibration.fit_temperature:
        result.update(_fit_temperature(ctx, Path(result["model_dir"]), result["model_sha256"]))
    return result


def _build_gguf(ctx) -> dict:
    from tasks.gguf import build_gguf

    artifact = ctx.config.artifact
    source = ctx.result("resolve")
    ctx.say(f"build: {'quantizing to ' + artifact.quantization if artifact.quantization else 'adopting'} {Path(source['source_path']).name}")
    built = build_gguf(
        Path(source["source_path"]), ctx.backends.state_dir / "builds",
        quantization=artifact.quantization, allow_requantize=artifact.allow_requantize, threads=ctx.config.image.threads,
    ).to_dict()
    model_dir = ctx.stage_dir("build") / "model"
    model_dir.mkdir(exist_ok=True)
    link = model_dir / Path(built["path"]).name
    if not link.exists():
        link.symlink_to(built["path"])
    return {
        "gguf_path": str(built["path"]),
        "gguf_sha256": built["sha256"],
        "model_dir": str(model_dir),
        "model_sha256": built["sha256"],
        "info": built["info"],
        "quantized_from": built.get("quantized_from"),
        "letter_tokens": built.get("letter_token_ids"),
    }


def _build_onnx(ctx) -> dict:
    from tasks.onnx_export import export_onnx, parity_check, require_parity
    from validation.nli_eval import load_nli_dataset

    artifact = ctx.config.artifact
    source = ctx.result("resolve")
    checkpoint = Path(source["source_path"])
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


def _calibration_predictions(ctx, url: str) -> tuple[list, str]:
    """Score the calibration split through the model's own server; returns predictions and the data digest."""
    settings = ctx.config.validation
    report = progress_counter(ctx.say, "calibration")
    if ctx.config.artifact.kind == "onnx":
        from validation.nli_eval import load_nli_dataset
        from validation.nli_runner import run_pairs

        ref = ctx.config.calibration.dataset
        dataset = load_nli_dataset(_data_path(ctx, ref), name="calibration", splits=ref.splits)
        run = run_pairs(url, dataset.pairs, batch_size=settings.batch_size, timeout_s=settings.request_timeout_s,
                        deadline_s=settings.deadline_s, dataset_name="calibration", progress=report)
        return run.predictions, dataset.sha256
    from validation.datasets import load_decision_dataset
    from validation.runner import run_decisions

    dataset = load_decision_dataset(ctx.config.calibration.dataset, ctx.config_dir, name="calibration")
    predictions = run_decisions(url, dataset.tasks, concurrency=settings.concurrency, timeout_s=settings.request_timeout_s,
                                deadline_s=settings.deadline_s, dataset_name="calibration", progress=report)
    return predictions, dataset.sha256


def _fit_temperature(ctx, model_dir: Path, model_sha256: str) -> dict:
    from validation.calibration import fit_temperature

    spec = component_spec(ctx, model_dir, copies=1, model_ref={"model_sha256": model_sha256, "purpose": "calibration"})
    with temporary_endpoint(ctx, resource_name(ctx, "cal", model_sha256), "model", spec) as url:
        predictions, data_sha256 = _calibration_predictions(ctx, url)
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
    path = ctx.stage_dir("build") / "calibration.json"
    tmp = path.with_name(f".calibration.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(calibration, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    ctx.say(f"build: temperature {fit.temperature:.3f} (NLL {fit.nll_before:.3f} → {fit.nll_after:.3f} on {fit.n} examples)")
    if fit.at_bound:
        ctx.say(
            f"build: warning: the fit stopped at the search bound {fit.temperature:g}; the logits carry "
            "little information on this split, so the fitted model is close to uniform"
        )
    return {"temperature": fit.temperature, "calibration": calibration, "calibration_file": str(path)}
