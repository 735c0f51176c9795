"""validate: gate the live candidate on the configured datasets against the serving champion."""

from __future__ import annotations

from tasks.stages.candidate import COMPONENT
from tasks.stages.common import describe_if_present, production_endpoint


def live_champion(ctx):
    """The production component's live URL and release, or None when nothing serves yet."""
    from validation.evaluate import Target

    described = describe_if_present(ctx.backends.hosting, production_endpoint(ctx))
    if not described:
        return None, None
    component = described.get("components", {}).get(ctx.config.name)
    if not component:
        return None, None
    ref = component["spec"]["model_ref"]
    url = ctx.backends.hosting.endpoint_url(production_endpoint(ctx))
    return Target(url=url, component=ctx.config.name, label=f"champion {ref.get('release_id')}"), ref


def _evaluate(ctx, candidate, champion) -> dict:
    """Decision gates for GGUF models, NLI gates for encoders; same evidence files either way."""
    from validation.evaluate import RunSettings

    cfg = ctx.config.validation
    settings = RunSettings(cfg.concurrency, cfg.request_timeout_s, cfg.deadline_s, cfg.n_bootstrap, cfg.seed)
    common = dict(thresholds=cfg.thresholds, champion_rule=cfg.champion, champion=champion, settings=settings,
                  progress=ctx.say, title=f"{ctx.release_id} gate")
    if cfg.kind == "nli":
        from tasks.config import resolve_data_path
        from validation.nli_eval import evaluate_nli, load_nli_dataset

        datasets = [load_nli_dataset(resolve_data_path(ref, ctx.config_dir), name=f"dataset{i}", splits=ref.splits)
                    for i, ref in enumerate(cfg.datasets)]
        return evaluate_nli(candidate, datasets, ctx.stage_dir("validate"), batch_size=cfg.batch_size, **common)
    from validation.datasets import load_decision_dataset
    from validation.evaluate import evaluate_decisions

    datasets = [load_decision_dataset(ref, ctx.config_dir, name=f"dataset{i}") for i, ref in enumerate(cfg.datasets)]
    return evaluate_decisions(candidate, datasets, ctx.stage_dir("validate"), **common)


def run(ctx) -> dict:
    from validation.evaluate import Target

    deployed = ctx.result("deploy_candidate")
    candidate = Target(url=deployed["url"], component=COMPONENT, label="candidate")
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
    if "nli" in metrics:
        summary_metrics["macro_f1"] = metrics["nli"]["macro_f1"]["value"]
    summary_metrics["p95_ms"] = metrics["latency_ms"]["p95"]["value"]
    summary_metrics["n"] = metrics.get("n")
    ctx.say(f"validate: decision {report['decision']} (accuracy {summary_metrics['accuracy']:.3f}, ECE {summary_metrics['ece']:.3f})")
    return {
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
    }
