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


def run(ctx) -> dict:
    from validation.datasets import load_decision_dataset
    from validation.evaluate import RunSettings, Target, evaluate_decisions

    cfg = ctx.config.validation
    datasets = [load_decision_dataset(ref, ctx.config_dir, name=f"dataset{i}") for i, ref in enumerate(cfg.datasets)]
    deployed = ctx.result("deploy_candidate")
    candidate = Target(url=deployed["url"], component=COMPONENT, label="candidate")
    champion, champion_ref = live_champion(ctx)
    if champion_ref and champion_ref.get("release_id") == ctx.release_id:
        champion, champion_ref = None, None
    ctx.say(f"validate: {sum(len(d.tasks) for d in datasets)} tasks, champion: {champion.label if champion else 'none'}")
    report = evaluate_decisions(
        candidate, datasets, ctx.stage_dir("validate"),
        thresholds=cfg.thresholds, champion_rule=cfg.champion, champion=champion,
        settings=RunSettings(cfg.concurrency, cfg.request_timeout_s, cfg.deadline_s, cfg.n_bootstrap, cfg.seed),
        progress=ctx.say, title=f"{ctx.release_id} gate",
    )
    metrics = report["metrics"]
    summary_metrics = {
        key: metrics[key]["value"] if isinstance(metrics.get(key), dict) else metrics.get(key)
        for key in ("accuracy", "ece", "brier", "nll", "validity", "allowed_token_mass")
    }
    summary_metrics["p95_ms"] = metrics["latency_ms"]["p95"]["value"]
    summary_metrics["n"] = metrics.get("n")
    ctx.say(f"validate: decision {report['decision']} (accuracy {summary_metrics['accuracy']:.3f}, ECE {summary_metrics['ece']:.3f})")
    return {
        "decision": report["decision"],
        "metrics": summary_metrics,
        "checks": report["checks"],
        "not_passed": [
            f"{c['name']} {c['observed'] if c['observed'] is None else round(c['observed'], 4)} {c['comparator']} {c['threshold']}"
            for c in report["checks"] if c["status"] not in ("pass", "skipped")
        ],
        "thresholds": report["thresholds"],
        "datasets": [{k: d[k] for k in ("name", "path", "sha256", "n")} for d in report["datasets"]],
        "champion_release": champion_ref.get("release_id") if champion_ref else None,
        "report_json": report["paths"]["gate_report_json"],
        "report_html": report["paths"]["report_html"],
    }
