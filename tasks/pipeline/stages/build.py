"""build: make the servable model and prove it, size it, then optionally fit a temperature.

How the model is built and proven is the model family's (`tasks.families`: the GGUF family quantizes or
adopts, inspects and checks the letter slots; the ONNX family exports, optimizes, adds int8 and checks
parity against the PyTorch reference, which stops the release when it fails). The memory one
copy needs (weights + KV cache or activations + runtime) is measured and checked against the
placement before anything is uploaded. The temperature is fitted by NLL on the calibration split,
scored by the same server the endpoint will run (on this worker), and recorded so the package
stage writes `calibration.json` into the artifact. The built model is kept in the artifact store.
"""

from __future__ import annotations

from pathlib import Path

from shiplift.tasks.backends.placement import fit_problem
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.ledger.stage_results import BuildResult
from shiplift.tasks.pipeline.stages.common import resource_name
from shiplift.validation.calibration import fit_temperature


def run(ctx) -> BuildResult:
    built = ctx.family.build(ctx)
    memory = _memory(ctx, built)
    result = {**built.recorded(), "memory": {**memory._asdict(), "total_mb": memory.total_mb}, "temperature": 1.0,
              "calibration": None}
    if ctx.config.calibration.fit_temperature:
        result.update(_fit_temperature(ctx, built.model_dir, built.model_sha256))
    return BuildResult.model_validate(result)


def _memory(ctx, built):
    """What one copy needs; ConfigError (before any upload) when it cannot fit the placement."""
    estimate = ctx.family.memory(ctx, built)
    problem = fit_problem(estimate, ctx.config.placement)
    if problem:
        raise ConfigError(f"build: {problem}", fix="change placement or image limits in the release config")
    ctx.say(f"build: one copy needs {estimate.describe()}")
    return estimate


def _calibration_predictions(ctx, invoker) -> tuple[list, str]:
    """Score the calibration split through the model's own server; returns predictions and the data digest."""
    ref = ctx.config.calibration.dataset
    family = ctx.family
    return family.calibration_predictions(ctx, invoker, ref.resolve(ctx.config_dir), ref.splits, ctx.config.validation)


def _fit_temperature(ctx, model_dir: Path, model_sha256: str) -> dict:
    with ctx.backends.scratch.serve(ctx.config.image, model_dir,
                                    resource_name(ctx.config, "cal", model_sha256)) as invoker:
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
    ctx.say(f"build: temperature {fit.temperature:.3f} (NLL {fit.nll_before:.3f} → {fit.nll_after:.3f} on {fit.n} "
            "examples)")
    if fit.at_bound:
        ctx.say(
            f"build: warning: the fit stopped at the search bound {fit.temperature:g}; the logits carry "
            "little information on this split, so the fitted model is close to uniform"
        )
    return {"temperature": fit.temperature, "calibration": calibration}
