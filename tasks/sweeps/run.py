"""Running a sweep: its plan and cost bound, every candidate through the gate on the sweep's tasks, the pick, and the
pick's own release (docs/sweeps.md).

The sweep opens in the ledger (the rule's sha256, the candidates' config sha256s) before any candidate is evaluated.
Each candidate is an ordinary release run by the same stage runner the CLI uses (`tasks.pipeline.release`: each stage
under the policy table's retries and timeouts) from resolve through validate, then torn down; its gate report becomes
its evidence record, and the candidate release ends `swept`. A rerun continues: a candidate with evidence is not
evaluated again, one cut short resumes at its first stage not done, and nothing is recorded twice. Candidates take no
promotion lease (they never touch production), so `parallel` of them run at once, each in its own thread with its own
backends (its servers are separate processes); each takes its own candidate's lease instead, so two runs of one sweep
never evaluate the same candidate at once (`tasks.sweeps.records.holding_candidate`). Once every candidate has
evidence, `choose` gives the frontier and the pick. The pick is then released as any config is (`release_pick`): the
base config with the pick's axis values and the base's own gate datasets, so its gate against the champion runs on
tasks no candidate was measured on.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from shiplift.tasks.backends.pricing import load_price_table
from shiplift.tasks.backends.registry import make_backends
from shiplift.tasks.console import number
from shiplift.tasks.errors import ConfigError, NotReady, ShipliftError
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.sweep_records import SweepRecords
from shiplift.tasks.ledger.views import show
from shiplift.tasks.pipeline.release import (
    Progress,
    _teardown_quietly,
    default_actor,
    ensure_stage_retrying,
    prepare_release,
    print_progress,
    run_holder,
    run_release,
)
from shiplift.tasks.pipeline.table import STAGES_THROUGH_GATE, TEARDOWN
from shiplift.tasks.sweeps.config import MAX_PARALLEL, Candidate, Sweep
from shiplift.tasks.sweeps.evidence import candidate_hourly, champion_evidence, evidence_of
from shiplift.tasks.sweeps.policy import candidate_timeout_s
from shiplift.tasks.sweeps.records import CANDIDATE_LEASE_TTL_S, holding_candidate, open_sweep
from shiplift.validation.sweep_rule import choose


def plan(sweep: Sweep, *, parallel: int | None = None, table=None) -> dict[str, Any]:
    """What `sweep plan` shows and `sweep run` checks first: every candidate with its release id, config sha256 and
    $/h while it runs; the most the candidates cost per hour at once with `parallel` of them running (the `parallel`
    dearest; by default the sweep's own `parallel`), against `max_usd_per_hour`; the rule and its sha256. Reads prices
    only; writes nothing."""
    parallel = sweep.config.parallel if parallel is None else parallel
    if not 1 <= parallel <= MAX_PARALLEL:
        raise ConfigError(f"--parallel {parallel}: run 1 to {MAX_PARALLEL} candidates at once",
                          fix=f"pass --parallel between 1 and {MAX_PARALLEL}")
    table = (load_price_table() if table is None else table).once()
    rows = []
    for candidate in sweep.candidates:
        hourly = candidate_hourly(candidate.config, table)
        rows.append({"name": candidate.name, "release_id": candidate.release_id,
                     "config_sha256": candidate.config_sha256, "values": candidate.values,
                     "usd_per_hour": hourly.usd_per_hour, "price": hourly.describe()})
    standing = sorted((r["usd_per_hour"] or 0.0 for r in rows), reverse=True)
    at_once = min(parallel, len(rows))
    return {"sweep_id": sweep.sweep_id, "name": sweep.config.name, "base": str(sweep.base_path),
            "candidates": rows, "parallel": at_once, "usd_per_hour_all": round(sum(standing), 6),
            "usd_per_hour_at_once": round(sum(standing[:at_once]), 6),
            "max_usd_per_hour": sweep.config.max_usd_per_hour,
            "unpriced": [r["name"] for r in rows if r["usd_per_hour"] is None],
            "rule": sweep.config.rule.canonical(), "rule_sha256": sweep.config.rule.sha256(),
            "datasets": [ref.model_dump(mode="json", exclude_none=True) for ref in sweep.config.datasets]}


def check_cost(sweep: Sweep, planned: dict) -> None:
    """ConfigError when the candidates running at once may cost more per hour than the sweep allows, or when a
    candidate billed by the hour has no price (the bound could not be checked). Serverless candidates bill per request
    and add nothing while idle."""
    unpriced = [row for row in planned["candidates"] if row["usd_per_hour"] is None
                and sweep.candidate(row["name"]).config.placement.kind != "serverless"]
    if unpriced:
        raise ConfigError(f"{sweep.path}: no hourly price for {', '.join(r['name'] for r in unpriced)} "
                          f"({'; '.join(r['price'] for r in unpriced)}), so max_usd_per_hour cannot be checked",
                          fix="add the type to the price table (`shiplift prices refresh`), or drop the candidate")
    if planned["usd_per_hour_at_once"] > sweep.config.max_usd_per_hour:
        raise ConfigError(f"{sweep.path}: {planned['parallel']} candidates at once may cost "
                          f"{planned['usd_per_hour_at_once']:.4g} $/h, above max_usd_per_hour "
                          f"{sweep.config.max_usd_per_hour:g}",
                          fix="lower --parallel, drop the dearest placements, or raise max_usd_per_hour")


def run_sweep(sweep: Sweep, *, parallel: int | None = None, actor: str | None = None,
              progress: Progress = print_progress) -> dict[str, Any]:
    """Open (or continue) the sweep, evaluate every candidate not yet evaluated, up to `parallel` at once (by default
    the sweep's own `parallel`), then record the frontier and the pick. Returns the sweep's summary; ShipliftError
    naming the candidates that failed (each recorded; a rerun retries them) before anything is picked."""
    actor = actor or default_actor()
    parallel = sweep.config.parallel if parallel is None else parallel
    table = load_price_table().once()
    planned = plan(sweep, parallel=parallel, table=table)
    check_cost(sweep, planned)
    progress(f"sweep {sweep.sweep_id}: {len(sweep.candidates)} candidates, {planned['parallel']} at once ≈ "
             f"{planned['usd_per_hour_at_once']:.4g} $/h (all: {planned['usd_per_hour_all']:.4g} $/h; bound "
             f"{sweep.config.max_usd_per_hour:g} $/h); rule sha256 {planned['rule_sha256']}")
    ledger = make_backends(sweep.base).ledger
    records = open_sweep(ledger, sweep, actor=actor)
    pending = [c for c in sweep.candidates if c.name not in records.evaluated]
    if len(pending) < len(sweep.candidates):
        progress(f"sweep {sweep.sweep_id}: {len(sweep.candidates) - len(pending)} candidates already have evidence")
    failures = _evaluate_all(sweep, pending, ledger, table, parallel=parallel, actor=actor, progress=progress)
    if failures:
        raise ShipliftError(f"sweep {sweep.sweep_id}: {len(failures)} of {len(sweep.candidates)} candidates failed: "
                            + "; ".join(f"{name}: {error}" for name, error in failures.items()),
                            fix="fix what failed and rerun `shiplift sweep run`: candidates with evidence are not "
                                "evaluated again")
    return record_pick(ledger, sweep.sweep_id, actor=actor, progress=progress)


def _evaluate_all(sweep: Sweep, pending: list[Candidate], ledger, table, *, parallel: int, actor: str,
                  progress: Progress) -> dict[str, str]:
    """Evaluate the pending candidates (in this thread when one at a time, so each stage keeps its deadline), each one's
    evidence or failure recorded as it ends; returns candidate name → error of those that failed."""
    failures: dict[str, str] = {}

    def attempt(candidate: Candidate) -> None:
        try:
            evaluate_and_record(sweep, candidate, ledger, table, actor=actor, progress=progress)
        except Exception as exc:  # recorded as the candidate's failure; the others go on
            failures[candidate.name] = failure_text(exc)

    if parallel == 1:
        for candidate in pending:
            attempt(candidate)
        return failures
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="sweep") as pool:
        for future in as_completed([pool.submit(attempt, candidate) for candidate in pending]):
            future.result()
    return failures


def failure_text(exc: BaseException) -> str:
    """A candidate's failure as its record and the sweep's error name it."""
    return str(exc) if isinstance(exc, ShipliftError) else repr(exc)


def evaluate_and_record(sweep: Sweep, candidate: Candidate, ledger, table, *, actor: str, progress: Progress,
                        holder: str | None = None, wait_s: float | None = None) -> dict[str, Any]:
    """Evaluate one candidate under its lease (`holding_candidate`) and record its evidence (`sweep/evaluated`),
    returning that payload; evidence another run recorded meanwhile is returned instead, and nothing runs. On a
    failure, record it (`sweep/failed`: a rerun retries the candidate) and raise it again. What the CLI's pool and each
    orchestrated candidate task run. `holder`: an orchestrator's run, holding the lease by name (a retry of that run
    takes it again), which never waits for another run (its worker would wait); None: this CLI process, which waits
    up to `wait_s` (by default one evaluation's bound, `candidate_timeout_s`) for another run holding the candidate.
    LeaseHeld (recorded nowhere: the candidate did not fail) when the other run still holds it then."""
    if wait_s is None:
        wait_s = 0.0 if holder is not None else float(candidate_timeout_s(candidate.config))
    with holding_candidate(ledger, sweep, candidate, holder=holder or run_holder(actor),
                           by_this_process=holder is None, wait_s=wait_s, progress=progress) as lease:
        recorded = SweepRecords.read(ledger, sweep.sweep_id).evaluated.get(candidate.name)
        if recorded is not None:
            progress(f"sweep {sweep.sweep_id}: {candidate.name} already has evidence (recorded by another run)")
            return recorded
        try:
            outcome = evaluate_candidate(sweep, candidate, ledger, table, actor=actor, progress=progress)
        except Exception as exc:
            record_failure(sweep, candidate, ledger, exc, actor=actor, progress=progress)
            raise
        # LeaseLost when another run took the candidate over meanwhile (this one stopped renewing): it records its own
        ledger.renew_lease(lease.model, lease.holder, lease.release_id, CANDIDATE_LEASE_TTL_S, token=lease.token)
        ledger.append(release_id=sweep.sweep_id, model=sweep.base.name, stage=events.SWEEP, event=events.EVALUATED,
                      payload=outcome, actor=actor)
    metrics = outcome["evidence"]["metrics"]
    progress(f"sweep {sweep.sweep_id}: {candidate.name} evaluated (accuracy {number(metrics.get('accuracy'))}, "
             f"p95 {number(metrics.get('p95_ms'))} ms, {number(metrics.get('usd_per_1m_decisions'))} $/1M "
             "decisions)")
    return outcome


def record_failure(sweep: Sweep, candidate: Candidate, ledger, exc: BaseException, *, actor: str,
                   progress: Progress) -> None:
    """Record a candidate's failure for the sweep (`sweep/failed`: a rerun retries the candidate) and say it."""
    error = failure_text(exc)
    ledger.append(release_id=sweep.sweep_id, model=sweep.base.name, stage=events.SWEEP, event=events.FAILED,
                  payload={"candidate": candidate.name, "release_id": candidate.release_id, "error": error,
                           "error_type": type(exc).__name__}, actor=actor)
    progress(f"sweep {sweep.sweep_id}: {candidate.name} failed: {error}")


def evaluate_candidate(sweep: Sweep, candidate: Candidate, ledger, table, *, actor: str,
                       progress: Progress) -> dict[str, Any]:
    """Run one candidate's release from resolve through validate on the sweep's tasks, tear it down (also when a
    stage fails), end it `swept`, and return its `sweep/evaluated` payload (its evidence, the champion's as its gate
    measured it)."""
    backends = make_backends(candidate.config, ledger=ledger)
    ctx = prepare_release(candidate.config, sweep.base_path, backends, actor=actor, progress=progress)
    ctx.record_opened()
    if ctx.state.status != events.SWEPT:
        try:
            for name in STAGES_THROUGH_GATE:
                ensure_stage_retrying(ctx, name)
        except BaseException:
            _teardown_quietly(ctx)  # the failure is what the sweep records, not a teardown's after it
            raise
        ensure_stage_retrying(ctx, TEARDOWN)
        ctx.record(events.RELEASE, events.SWEPT, {"sweep_id": sweep.sweep_id})
    gate = ctx.result(events.VALIDATE)
    report = json.loads(ctx.local_ref(gate.evidence["gate-report.json"]).read_text())
    evidence = evidence_of(candidate.name, candidate.config_sha256, report, candidate_hourly(candidate.config, table),
                           ctx.family.items_per_request(candidate.config.validation))
    champion = None
    if gate.champion_release:
        shown = show(ledger, gate.champion_release)
        champion = champion_evidence(report, shown["config"], shown["config_hash"], table)
    return {"candidate": candidate.name, "release_id": candidate.release_id, "config_sha256": candidate.config_sha256,
            "evidence": evidence.to_json(), "champion": champion.to_json() if champion else None,
            "champion_release": gate.champion_release, "gate_decision": gate.decision,
            "gate_report": gate.evidence["gate-report.json"].model_dump(mode="json")}


def record_pick(ledger, sweep_id: str, *, actor: str, progress: Progress = print_progress) -> dict[str, Any]:
    """Choose by the recorded rule on the recorded evidence and append the `picked` record (once: a sweep that picked
    already keeps its record); returns the sweep's summary."""
    records = SweepRecords.load(ledger, sweep_id)
    if records.pending():
        raise NotReady(f"sweep {sweep_id}: {', '.join(records.pending())} have no evidence yet",
                       fix="run `shiplift sweep run CONFIG` to evaluate them")
    pick = choose(records.rule, records.evidence())
    if records.picked is None:
        ledger.append(release_id=sweep_id, model=records.opened["model"], stage=events.SWEEP, event=events.PICKED,
                      payload={"pick": pick.to_json(), "frontier": pick.frontier, "picked": pick.picked}, actor=actor)
        records = SweepRecords.load(ledger, sweep_id)
    progress(f"sweep {sweep_id}: picked {pick.picked or 'nothing (no candidate meets the rule)'}; frontier "
             f"{', '.join(pick.frontier) or 'empty'}")
    return summary(records)


def summary(records: SweepRecords) -> dict[str, Any]:
    """The sweep as `sweep run` prints it: the pick, the frontier, each candidate's verdict and the headline evidence
    the rule judged (speeds on the sweep's scale, which `speed` names)."""
    recorded = records.recorded_pick()
    verdicts = {v.name: v for v in recorded.verdicts} if recorded else {}
    judged = {evidence.name: evidence.metrics for evidence in records.evidence()}
    rows = []
    for candidate in records.candidates:
        metrics = judged.get(candidate["name"], {})
        verdict = verdicts.get(candidate["name"])
        rows.append({"name": candidate["name"], "release_id": candidate["release_id"],
                     "status": verdict.status if verdict else ("failed" if candidate["name"] in records.failed
                                                               else "pending"),
                     **{key: metrics.get(key) for key in ("accuracy", "ece", "p95_ms", "usd_per_hour",
                                                           "usd_per_1m_decisions")},
                     "reason": verdict.reason if verdict else
                     (records.failed.get(candidate["name"]) or {}).get("error")})
    return {"sweep_id": records.sweep_id, "rule_sha256": records.opened["rule_sha256"],
            "picked": recorded.picked if recorded else None, "frontier": recorded.frontier if recorded else None,
            "candidates": rows, "speed": records.speed_scale().to_json(), "handed_off": records.handed_off}


def release_pick(ledger, sweep_id: str, *, actor: str | None = None, keep_candidate: bool | None = None,
                 fresh_champion: bool = False, progress: Progress = print_progress) -> dict[str, Any]:
    """Release the sweep's pick as any config is released (`run_release`: its gate against the champion on the base's
    own datasets, which no candidate was measured on, and with `fresh_champion` the champion scored on every task;
    approval where the base requires one; its rollout), and record which release that is. NotReady before the sweep
    picked; ConfigError when it picked nothing."""
    actor = actor or default_actor()
    records = SweepRecords.load(ledger, sweep_id)
    pick = records.recorded_pick()
    if pick is None:
        raise NotReady(f"sweep {sweep_id} has not picked yet", fix="run `shiplift sweep run CONFIG` until it picks")
    if pick.picked is None:
        raise ConfigError(f"sweep {sweep_id} picked nothing: no candidate met its rule",
                          fix="see `shiplift sweep explain` for why each candidate lost; a new rule is a new sweep")
    chosen = next(c for c in records.candidates if c["name"] == pick.picked)
    base_path = Path(records.opened["base_path"])
    progress(f"sweep {sweep_id}: releasing the pick {pick.picked} ({base_path.name} with "
             f"{' '.join(chosen['overrides']) or 'no change'})")
    released = run_release(base_path, overrides=tuple(chosen["overrides"]), keep_candidate=keep_candidate,
                           fresh_champion=fresh_champion, actor=actor, progress=progress)
    if records.handed_off is None or records.handed_off.get("release_id") != released["release_id"]:
        ledger.append(release_id=sweep_id, model=records.opened["model"], stage=events.SWEEP,
                      event=events.HANDED_OFF, payload={"candidate": pick.picked, "release_id": released["release_id"],
                                                        "overrides": chosen["overrides"]}, actor=actor)
    return released
