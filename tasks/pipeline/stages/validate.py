"""validate: gate the live candidate on the configured datasets against the serving champion."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from pathlib import Path

from shiplift.tasks.backends.pricing import release_cost
from shiplift.tasks.ledger.events import STARTED, SUCCEEDED, VALIDATE
from shiplift.tasks.ledger.records import stage_payload
from shiplift.tasks.ledger.stage_results import KeptRef, ValidateResult
from shiplift.tasks.ledger.views import config_changes, show
from shiplift.tasks.pipeline.stages.common import component_spec, production_component, production_endpoint
from shiplift.validation.champion_reuse import ChampionOffer, Identity, Recorded
from shiplift.validation.cold_start import cold_start_check, cold_start_kind, first_answer, stop_for_cold_start
from shiplift.validation.evaluate import GateOutcome, RunSettings, Target
from shiplift.validation.extension import Budget, extend_champion_check, extension_summary
from shiplift.validation.gate_power import paired_disagreement, plan_champion_checks
from shiplift.validation.gates import check_text, summary_line
from shiplift.validation.runner import read_predictions


def live_champion(ctx):
    """The production component and the ledger's view of the release it serves (`views.show`, read once for its
    build's determinism and its config), or (None, None) when nothing serves yet (or it serves this release); its
    Target carries the offer of its recorded per-task results (`champion_offer`)."""
    hosting = ctx.backends.hosting
    endpoint, component = production_endpoint(ctx.config), production_component(ctx.config)
    live = hosting.describe(endpoint, component)
    if live is None or live.model_ref is None or live.status != "InService":
        return None, None
    ref = live.model_ref.model_dump()
    if ref["release_id"] == ctx.release_id:
        return None, None
    shown = show(ctx.backends.ledger, ref["release_id"])
    if live.copies == 0:  # scaled to zero while idle: woken first, so the gate scores it warm
        ctx.say(f"validate: the champion {endpoint}/{component} is scaled to zero; starting a copy to score it")
        hosting.set_copies(endpoint, component, 1, progress=ctx.say)
    invoker = hosting.invoker(endpoint, component, timeout_s=ctx.config.validation.request_timeout_s)
    return Target(invoker, f"champion {ref['release_id']}", champion_offer(ctx, live, shown["determinism"])), shown


def served_identity(ctx, serving_id: str, determinism: dict | None) -> Identity | None:
    """What fixes the answers of the model `serving_id` whose build recorded `determinism`, asked through this family's
    readout (`validation.champion_reuse.Identity`); None where the family's gate scores its champion afresh always."""
    if not ctx.family.reuses_champion_results:
        return None
    return Identity(serving_id, determinism, ctx.family.readout(ctx.config.validation).name)


def champion_offer(ctx, live, determinism: dict | None) -> ChampionOffer | None:
    """The live champion's identity (its build's `determinism`) and the per-task files gates recorded of it, newest
    first, unless this release asked to score it afresh (`--fresh-champion`, or `validation.champion.reuse: fresh`)."""
    identity = served_identity(ctx, live.serving_id(), determinism)
    if identity is None:
        return None
    rule = ctx.config.validation.champion
    fresh = ("--fresh-champion" if ctx.state.fresh_champion else
             "validation.champion.reuse is fresh" if rule.reuse == "fresh" else None)
    recorded = [] if fresh else recorded_results(ctx, identity.sha256())
    return ChampionOffer(identity, recorded, rule.latency_sample, fresh=fresh)


def recorded_results(ctx, identity: str) -> list[Recorded]:
    """Every per-task file a gate in the ledger measured live on a model of `identity` (its validate record's
    `measured`), newest first; each read from the artifact store only when a gate uses it."""
    found = []
    for record in reversed(ctx.backends.ledger.events(VALIDATE, SUCCEEDED)):
        gate = stage_payload(record, ValidateResult)
        for name, measured in (gate.measured or {}).items():
            if measured["identity"] == identity and name in gate.evidence:
                found.append(Recorded(record.release_id, name, measured["keys"],
                                      functools.partial(kept_rows, ctx, gate.evidence[name])))
    return found


def kept_rows(ctx, ref: KeptRef) -> list[dict]:
    """A kept predictions file's rows."""
    return [p.to_dict() for p in read_predictions(ctx.local_ref(ref))]


def measured_files(ctx, gate: GateOutcome, champion: Target | None) -> tuple[dict[str, dict], dict | None]:
    """What the validate record keeps of the per-task files this gate measured live (`ValidateResult.measured`: the
    candidate's always, the champion's when it was scored, not reused), and of the champion's evidence (the gate
    report's: reused from which release, or why it was scored); ({}, None) for a family that reuses nothing."""
    candidate = served_identity(ctx, component_spec(ctx, ctx.config, copies=1).serving_id(),
                                (ctx.result("build").model_extra or {}).get("determinism"))
    if candidate is None:
        return {}, None
    measured = {"predictions.jsonl": candidate.measured(gate.datasets)}
    if champion is None or champion.offer is None:
        return measured, None
    evidence = gate.champion_evidence
    if evidence is None or not evidence["reused"]:  # scored live on every task (a dry run's stand-in gate says none)
        measured["champion-predictions.jsonl"] = champion.offer.identity.measured(gate.datasets)
    return measured, evidence


def release_context(ctx, champion_shown: dict | None) -> dict:
    """What the gate report shows beside the measurements (`validation.evaluate.RELEASE_CONTEXT`, cost apart): the
    config fields this release changed against the champion's release (`champion_shown`, its ledger view), and the
    temperature it serves with."""
    built = ctx.result("build")
    return {"release_id": ctx.release_id, "champion_release": champion_shown["release_id"] if champion_shown else None,
            "config_changes": config_changes(champion_shown["config"] if champion_shown else None,
                                             ctx.config.model_dump(mode="json")),
            "temperature": {"value": built.temperature, "fitted": ctx.config.calibration.fit_temperature}}


def gate_cost(ctx, metrics: dict) -> dict:
    """The release's cost as the gate sees it (`tasks.backends.pricing.release_cost`): the candidate from
    deploy_candidate's start until now, production per hour, per million at the gate's measured rate."""
    started = next((r.recorded_at for r in ctx.state.records if (r.stage, r.event) == ("deploy_candidate", STARTED)),
                   None)
    rate = (metrics.get("throughput") or {}).get("answers_per_second")
    return release_cost(ctx.config, answers_per_second=rate, items_per_request=ctx.family.items_per_request(
        ctx.config.validation), candidate_since=started, until=datetime.now(UTC).isoformat())


def cold_starts(ctx, deployed, invoker) -> dict | None:
    """For a release whose production starts from zero (scale_to_zero, or a serverless placement): time the config's
    cold starts of the candidate, each from no copy to the first answer of the gate's first request, and the check of
    their p95 (None otherwise). A component that scales to zero is first let scale as production will; a serverless
    candidate's first start is its first request since its deploy (SageMaker has no call that sends a serverless
    endpoint's compute away, so only the local backend times more than one)."""
    bound, validation = ctx.config.cold_start_bound, ctx.config.validation
    if bound is None:
        return None
    starts_wanted, max_p95_s = bound
    hosting, endpoint, component = ctx.backends.hosting, deployed.endpoint, deployed.component
    serverless = ctx.config.placement.kind == "serverless"
    if not serverless:
        hosting.enable_scale_to_zero(endpoint, component, ctx.config.scale_to_zero.plan(1), progress=ctx.say)
    body = ctx.family.invocation_bodies(validation, validation.dataset_paths(ctx.config_dir))[0]
    starts = []
    for number in range(1, starts_wanted + 1):
        if number > 1 or not serverless:
            stop_for_cold_start(hosting, endpoint, component, progress=ctx.say)
        start = first_answer(invoker, body, timeout_s=validation.request_timeout_s, deadline_s=2 * max_p95_s)
        ctx.say(f"validate: cold start {number}/{starts_wanted}: "
                + (f"no answer ({start.error})"
                   if start.error else f"{start.seconds:.2f} s, {start.attempts} attempts"))
        starts.append(start)
    check = cold_start_check(starts, max_p95_s)
    return {"starts": [s.to_dict() for s in starts], "p95_s": check["observed"], "max_p95_s": max_p95_s, "check": check,
            "kind": cold_start_kind(hosting)}


def gate_title(ctx) -> str:
    """The gate report's title (written by the family's evaluation, again by an extension)."""
    return f"{ctx.release_id} gate"


def run_settings(cfg):
    """The gate's request and statistics settings (`validation.evaluate.RunSettings`) of `validation`."""
    return RunSettings(cfg.concurrency, cfg.request_timeout_s, cfg.deadline_s, cfg.n_bootstrap, cfg.seed)


def _evaluate(ctx, candidate, champion, context) -> GateOutcome:
    """The model family's gate over the configured datasets; the same evidence files for every family."""
    cfg = ctx.config.validation
    settings = run_settings(cfg)
    return ctx.family.evaluate(candidate, champion, cfg.dataset_paths(ctx.config_dir), ctx.stage_dir("validate"),
                               validation=cfg, settings=settings,
                               progress=ctx.say, title=gate_title(ctx), context=context,
                               built=ctx.result("build"))


def asked_evidence(cfg, out_dir: Path, checks: list[dict]) -> dict:
    """What a person asked to decide an inconclusive gate reads beside the report: the champion check's interval, the
    gate's power at its size (`validation.gate_power.plan_champion_checks`, with the disagreement these two models
    showed on the gate's tasks) and the evidence files."""
    accuracy = next(c for c in checks if c["name"] == "champion_accuracy")
    rows = [[p.to_dict() for p in read_predictions(out_dir / name)]
            for name in ("predictions.jsonl", "champion-predictions.jsonl")]
    plans = plan_champion_checks(cfg.champion, accuracy["n"], disagreements=[paired_disagreement(*rows)])
    return {"interval": accuracy["ci"], "n": accuracy["n"], "margin": cfg.champion.margin,
            "power": [plan.as_dict() for plan in plans],
            "power_text": [plan.warning("the gate's datasets") if plan.underpowered else
                           f"{plan.check}: an equally good candidate passes with probability {plan.equal_passes:.2f} "
                           f"on {plan.n} tasks" for plan in plans]}


def escape_refused(choice: str, undecided: set[str], *, ratio_per_request: bool) -> str | None:
    """Why `ask` or `extend` cannot take an inconclusive gate whose inconclusive checks are `undecided` (None: it can):
    they must be champion checks (accuracy, ECE, the p95 ratio), one of them accuracy or the ratio (ECE alone has no
    sequential judgement; it is judged again once, beside them). `extend` judges the ratio again on the reserve's rows
    as requests, so only where one prediction is one request (`ratio_per_request`; an NLI batch is not)."""
    allowed = {"champion_accuracy", "champion_ece", "champion_p95_ratio"}
    if choice == "extend" and not ratio_per_request:
        allowed.discard("champion_p95_ratio")
    if undecided <= allowed and undecided & {"champion_accuracy", "champion_p95_ratio"}:
        return None
    return (f"{choice} applies to inconclusive {', '.join(sorted(allowed - {'champion_ece'}))} checks (and "
            f"champion_ece beside them); inconclusive here: {', '.join(sorted(undecided))}")


def follow_choice(ctx, gate: GateOutcome, candidate, champion) -> tuple[str, list[dict], dict | None]:
    """An inconclusive gate follows the release's `validation.inconclusive.choice`: `block` stays inconclusive (it
    does not promote); `ask` stays inconclusive and promote waits for a person (`tasks.pipeline.approval`) with the
    interval, the power and the evidence; `extend` scores reserve tasks and judges the inconclusive champion accuracy
    and latency-ratio checks again (`validation.extension`), and the decision becomes the extension's. Either applies
    only when what is inconclusive is among the champion checks (`escape_refused`). Returns (decision, checks, the
    record of the choice: the first look and the outcome; None when the gate was not inconclusive)."""
    cfg = ctx.config.validation
    if gate.decision != "inconclusive":
        return gate.decision, gate.checks, None
    choice = cfg.inconclusive.choice
    record: dict = {"choice": choice, "first_look": {"decision": gate.decision, "checks": gate.checks}}
    out_dir = gate.gate_report_json.parent
    undecided = {c["name"] for c in gate.checks if c["status"] == "inconclusive"}
    if choice == "block":
        ctx.say("validate: inconclusive; validation.inconclusive.choice is block, so the champion keeps serving")
        return gate.decision, gate.checks, {**record, "outcome": "blocked"}
    why = escape_refused(choice, undecided, ratio_per_request=ctx.family.items_per_request(cfg) == 1)
    if why:
        ctx.say(f"validate: {why}; blocked")
        return gate.decision, gate.checks, {**record, "outcome": "blocked", "why": why}
    if choice == "ask":
        asked = asked_evidence(cfg, out_dir, gate.checks)
        shown = "; ".join(check_text(c) for c in gate.checks if c["status"] == "inconclusive")
        ctx.say(f"validate: inconclusive ({shown}); validation.inconclusive.choice is ask: a person decides before "
                "promote")
        return gate.decision, gate.checks, {**record, "outcome": "asked", **asked}

    extend = cfg.inconclusive.extend
    evidence = extend_champion_check(
        out_dir, candidate=candidate, champion=champion,
        reserve=ctx.family.reserve(cfg, ctx.config_dir, run_settings(cfg), ctx.say), rule=cfg.champion,
        budget=Budget(extend.batch, extend.max_tasks, extend.deadline_s), title=gate_title(ctx), progress=ctx.say)
    return evidence["decision"], evidence["checks"], {**record, "outcome": f"extended: {evidence['decision']}",
                                                       "extension": extension_summary(evidence)}


def run(ctx) -> ValidateResult:
    deployed = ctx.result("deploy_candidate")
    invoker = ctx.backends.hosting.invoker(deployed.endpoint, deployed.component,
                                           timeout_s=ctx.config.validation.request_timeout_s)
    candidate = Target(invoker, "candidate")
    cold = cold_starts(ctx, deployed, invoker)
    champion, champion_shown = live_champion(ctx)
    ctx.say(f"validate: champion {champion.label if champion else 'none'}")
    measured: dict = {}

    def context(metrics: dict) -> dict:
        measured["cost"] = gate_cost(ctx, metrics)
        release = {**release_context(ctx, champion_shown), "cost": measured["cost"]}
        if cold is not None:
            release.update(cold_start={k: v for k, v in cold.items() if k != "check"}, checks=[cold["check"]])
        return release

    gate = _evaluate(ctx, candidate, champion, context)
    decision, checks, inconclusive = follow_choice(ctx, gate, candidate, champion)
    metrics = gate.metrics
    summary_metrics = {
        key: metrics[key]["value"] if isinstance(metrics.get(key), dict) else metrics.get(key)
        for key in ("accuracy", "macro_f1", "ece", "brier", "nll", "validity", "allowed_token_mass")
        if key in metrics
    }
    summary_metrics.update(ctx.family.summary_metrics(metrics))
    summary_metrics["p95_ms"] = metrics["latency_ms"]["p95"]["value"]
    if cold is not None:
        summary_metrics["cold_start_p95_s"] = cold["p95_s"]
    summary_metrics["n"] = metrics.get("n")
    shown = {key: "n/a" if summary_metrics.get(key) is None else f"{summary_metrics[key]:.3f}"
             for key in ("accuracy", "ece")}
    ctx.say(f"validate: cost: {measured['cost']['production']['text']}")
    ctx.say(f"validate: decision {summary_line(decision, checks)} (accuracy {shown['accuracy']}, "
            f"ECE {shown['ece']}; {metrics.get('n_valid', 'n/a')} of {metrics.get('n')} answers valid)")
    chosen = {} if inconclusive is None else {"inconclusive": inconclusive}
    measured, champion_evidence = measured_files(ctx, gate, champion)
    if measured:
        chosen["measured"] = measured
    if champion_evidence is not None:
        chosen["champion_evidence"] = champion_evidence
    return ValidateResult(
        decision=decision, metrics=summary_metrics, checks=checks, **chosen,
        not_passed=[check_text(c) for c in checks if c["status"] not in ("pass", "skipped")],
        thresholds=gate.thresholds,
        datasets=[{k: d[k] for k in ("name", "path", "sha256", "n")} for d in gate.datasets],
        champion_release=champion_shown["release_id"] if champion_shown else None,
        report_json=str(gate.gate_report_json), report_html=str(gate.report_html), cost=measured.get("cost"),
        evidence={path.name: ctx.keep_file(path, path.name) for path in sorted(gate.gate_report_json.parent.glob("*"))
                  if path.is_file() and path.suffix in (".json", ".jsonl", ".html")},
    )
