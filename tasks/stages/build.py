"""build: quantize or adopt the GGUF, inspect it, check the letter slots, optionally fit a temperature.

The temperature is fitted by NLL on the calibration split, scored by the same adapter file the
endpoint will run, and written to `calibration.json` so it travels inside the artifact.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.stages.common import resource_name, semif_spec, temporary_endpoint
from validation.evaluate import progress_counter


def run(ctx) -> dict:
    from tasks.gguf import build_gguf

    artifact = ctx.config.artifact
    source = ctx.result("resolve")
    out_dir = ctx.backends.state_dir / "builds"
    ctx.say(f"build: {'quantizing to ' + artifact.quantization if artifact.quantization else 'adopting'} {Path(source['source_path']).name}")
    built = build_gguf(
        Path(source["source_path"]),
        out_dir,
        quantization=artifact.quantization,
        allow_requantize=artifact.allow_requantize,
        threads=ctx.config.image.threads,
    ).to_dict()
    result = {
        "gguf_path": str(built["path"]),
        "gguf_sha256": built["sha256"],
        "info": built["info"],
        "quantized_from": built.get("quantized_from"),
        "letter_tokens": built.get("letter_tokens"),
        "temperature": 1.0,
        "calibration_file": None,
    }
    if ctx.config.calibration.fit_temperature:
        result.update(_fit_temperature(ctx, Path(result["gguf_path"]), result["gguf_sha256"]))
    return result


def _fit_temperature(ctx, gguf_path: Path, gguf_sha256: str) -> dict:
    from validation.calibration import fit_temperature
    from validation.datasets import load_decision_dataset
    from validation.runner import run_decisions

    dataset = load_decision_dataset(ctx.config.calibration.dataset, ctx.config_dir, name="calibration")
    ctx.say(f"build: fitting temperature on {len(dataset.tasks)} calibration tasks ({dataset.path.name})")
    model_dir = ctx.stage_dir("build") / "uncalibrated-model"
    model_dir.mkdir(exist_ok=True)
    link = model_dir / gguf_path.name
    if not link.exists():
        link.symlink_to(gguf_path)
    spec = semif_spec(ctx, model_dir, copies=1, model_ref={"gguf_sha256": gguf_sha256, "purpose": "calibration"})
    name = resource_name(ctx, "cal", gguf_sha256)
    with temporary_endpoint(ctx, name, "model", spec) as url:
        predictions = run_decisions(
            url, dataset.tasks, concurrency=ctx.config.validation.concurrency,
            timeout_s=ctx.config.validation.request_timeout_s, deadline_s=ctx.config.validation.deadline_s,
            dataset_name="calibration", progress=progress_counter(ctx.say, "calibration"),
        )
    failed = [p for p in predictions if p.error]
    usable = [p for p in predictions if not p.error and p.option_logits]
    index = [p.option_ids.index(p.expected) for p in usable]
    fit = fit_temperature([p.option_logits for p in usable], index)
    calibration = {
        "temperature": fit.temperature,
        "nll_before": fit.nll_before,
        "nll_after": fit.nll_after,
        "n": fit.n,
        "at_bound": fit.at_bound,
        "errors": len(failed),
        "dataset_sha256": dataset.sha256,
        "gguf_sha256": gguf_sha256,
    }
    path = ctx.stage_dir("build") / "calibration.json"
    path.write_text(json.dumps(calibration, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    ctx.say(f"build: temperature {fit.temperature:.3f} (NLL {fit.nll_before:.3f} → {fit.nll_after:.3f} on {fit.n} tasks)")
    if fit.at_bound:
        ctx.say(
            f"build: warning: the fit stopped at the search bound {fit.temperature:g}; the option logits carry "
            "little information on this split, so the fitted model is close to uniform"
        )
    return {"temperature": fit.temperature, "calibration": calibration, "calibration_file": str(path)}

