"""validate: gate the live candidate on the configured datasets against the serving champion."""

from __future__ import annotations

from pathlib import Path

from tasks.pipeline.results import ValidateResult
from tasks.pipeline.stages.common import keep_file, production_component, production_endpoint


def live_champion(ctx):
    """The production component and the release it serves, or (None, None) when nothing serves yet."""
    from validation.evaluate import Target

    hosting = ctx.backends.hosting
    endpoint, component = production_endpoint(ctx.config), production_component(ctx.config)
    live = hosting.describe(endpoint, component)
    if live is None or live.model_ref is None or live.status != "InService":
        return None, None
    invoker = hosting.invoker(endpoint, component, timeout_s=ctx.config.validation.request_timeout_s)
    ref = live.model_ref.model_dump()
    return Target(invoker, f"champion {ref['release_id']}"), ref


def _evaluate(ctx, candidate, champion) -> dict:
    """The model family's gate over the configured datasets; the same evidence files for every family."""
    from tasks.config import resolve_data_path
    from validation.evaluate import RunSettings

    cfg = ctx.config.validation
    settings = RunSettings(cfg.concurrency, cfg.request_timeout_s, cfg.deadline_s, cfg.n_bootstrap, cfg.seed)
    paths = [(resolve_data_path(ref, ctx.config_dir), ref.splits) for ref in cfg.datasets]
    return ctx.config.family.evaluate(candidate, champion, paths, ctx.stage_dir("validate"), validation=cfg,
                                                       settings=settings, progress=ctx.say, title=f"{ctx.release_id} gate")


def run(ctx) -> dict:
    from validation.evaluate import Target

    deployed = ctx.result("deploy_candidate")
    invoker = ctx.backends.hosting.invoker(deployed.endpoint, deployed.component,
                                           timeout_s=ctx.config.validation.request_timeout_s)
    candidate = Target(invoker, "candidate")
    champion, champion_ref = live_champion(ctx)
    if champion_ref and champion_ref.get("release_id") == ctx.release_id:
        champion, champion_ref = None, None
    ctx.say(f"validate: champion {champion.label if champion else 'none'}")
    report = _evaluate(ctx, candidate, champion)
    metrics = report["metrics"]
    summary_metrics = {
        key: metrics[key]["value"] if isinstance(metrics.get(key), dict) else metrics.get(key)
        for key in ("accuracy", "macro_f1", "ece", "brier", "nll", "validity", "allowed_token_mass")
        if key in metrics
    }
    summary_metrics.update(ctx.config.family.summary_metrics(metrics))
    summary_metrics["p95_ms"] = metrics["latency_ms"]["p95"]["value"]
    summary_metrics["n"] = metrics.get("n")
    shown = {key: "n/a" if summary_metrics.get(key) is None else f"{summary_metrics[key]:.3f}" for key in ("accuracy", "ece")}
    ctx.say(f"validate: decision {report['decision']} (accuracy {shown['accuracy']}, ECE {shown['ece']}; "
            f"{metrics.get('n_valid', 'n/a')} of {metrics.get('n')} answers valid)")
    return ValidateResult(**{
        "decision": report["decision"],
        "metrics": summary_metrics,
        "checks": report["checks"],
        "not_passed": [
            f"{c['name']} {c['observed'] if c['observed'] is None else round(c['observed'], 4)} (needs {c['comparator']} {c['threshold']})"
            for c in report["checks"] if c["status"] not in ("pass", "skipped")
        ],
        "thresholds": report["thresholds"],
        "datasets": [{k: d[k] for k in ("name", "path", "sha256", "n")} for d in report["datasets"]],
        "champion_release": champion_ref.get("release_id") if champion_ref else None,
        "report_json": report["paths"]["gate_report_json"],
        "report_html": report["paths"]["report_html"],
        "evidence": {Path(path).name: keep_file(ctx, Path(path), Path(path).name)
                     for path in sorted(Path(report["paths"]["gate_report_json"]).parent.glob("*"))
                     if path.is_file() and path.suffix in (".json", ".jsonl", ".html")},
    })
