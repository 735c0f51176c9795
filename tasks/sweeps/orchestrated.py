"""A sweep's steps as an orchestrator runs them, one call each (Airflow's sweep DAG, the Step Functions sweep machine;
docs/sweeps.md): open the sweep, evaluate one candidate, tear one candidate down after a crash, pick, release the pick.

Each step loads the sweep file itself and finds everything else in the ledger, so any worker that reaches the ledger
runs any step, and each is idempotent: the opening is found, not repeated (a changed rule refused); a candidate with
evidence returns it without running again, and one cut short resumes at its first stage not done; the pick is recorded
once. A candidate's step tears its endpoint down whether its evaluation succeeded or failed. A candidate's steps hold
its lease by the run's name (`tasks.sweeps.records.holding_candidate`), so another run (a CLI run, another DAG run or
execution) never evaluates or tears down the candidate meanwhile, while the run's other candidates go on in parallel.

So that the wait for its endpoint holds no worker (Airflow's deferrable candidate task, the Step Functions machine's
Wait/Choice loop), a candidate's step is two halves around it: `start_candidate_orchestrated` (the stages before the
one the policy table defers, and that stage's start), `poll_candidate_orchestrated` from the triggerer or a short
poll task, then `finish_candidate_orchestrated` (the rest, as `evaluate_orchestrated` runs it). The candidate's lease
is held by the run's name across them, as a refresh run holds the model's promotion lease across its deferred deploy:
kept past the first half for `LEASE.ttl_s`, renewed by every poll, and given back by the second half.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shiplift.tasks.backends.pricing import load_price_table
from shiplift.tasks.backends.registry import make_backends
from shiplift.tasks.errors import BadInput, ConfigError, Conflict, NotFound
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.sweep_records import SweepRecords
from shiplift.tasks.pipeline import table
from shiplift.tasks.pipeline.deferred import poll_orchestrated, start_orchestrated
from shiplift.tasks.pipeline.release import (
    Progress,
    StageContext,
    _teardown_quietly,
    ensure_stage_retrying,
    prepare_release,
    print_progress,
)
from shiplift.tasks.pipeline.table import MAX_STEP_TIMEOUT_S, STAGES_THROUGH_GATE, TEARDOWN
from shiplift.tasks.sweeps.config import Candidate, Sweep, load_sweep
from shiplift.tasks.sweeps.policy import candidate_timeout_s
from shiplift.tasks.sweeps.records import candidate_lease_key, holding_candidate, open_sweep
from shiplift.tasks.sweeps.run import (
    check_cost,
    evaluate_and_record,
    plan,
    record_failure,
    record_pick,
    release_pick,
)


def evaluation_timeout_s(sweep: Sweep) -> int:
    """`candidate_timeout_s` of the sweep's slowest candidate; ConfigError when that exceeds MAX_STEP_TIMEOUT_S, the
    most any orchestrator holds a worker for one step."""
    slowest = max(sweep.candidates, key=lambda c: candidate_timeout_s(c.config))
    seconds = candidate_timeout_s(slowest.config)
    if seconds > MAX_STEP_TIMEOUT_S:
        raise ConfigError(f"{sweep.path}: candidate {slowest.name} may need {seconds} s to evaluate, more than the "
                          f"{MAX_STEP_TIMEOUT_S} s an orchestrator holds a worker for one step",
                          fix="shorten the base's validation.deadline_s or placement.provision_timeout_s, or run the "
                              "sweep from the CLI (`shiplift sweep run`)")
    return seconds


def open_orchestrated(sweep_path: str | Path, *, actor: str, sweep_id: str | None = None,
                      allowed_timeout_s: int | None = None, progress: Progress = print_progress) -> dict[str, Any]:
    """The first step: check the cost bound at the sweep's `parallel`, check that a candidate's evaluation fits the
    orchestrator's timeout for it (`allowed_timeout_s`, what it was set up with), and open the sweep in the ledger (the
    rule's sha256 first), or find it open under the same rule. `sweep_id`: the sweep the orchestrator was rendered for
    (Conflict when the file now gives another). Returns the sweep's id and every candidate's name."""
    sweep = load_sweep(sweep_path)
    if sweep_id is not None and sweep.sweep_id != sweep_id:
        raise Conflict(f"{sweep.path} now gives sweep {sweep.sweep_id}, not {sweep_id}, which this state machine was "
                       "rendered for: its candidates changed", fix="render and deploy the sweep's state machine again")
    needed = evaluation_timeout_s(sweep)
    if allowed_timeout_s is not None and needed > allowed_timeout_s:
        raise ConfigError(f"{sweep.path}: a candidate may need {needed} s, but the orchestrator's candidate task "
                          f"allows {allowed_timeout_s} s",
                          fix="re-parse the sweep DAG (or re-render the state machine) from this version of the sweep")
    planned = plan(sweep, table=load_price_table().once())
    check_cost(sweep, planned)
    progress(f"sweep {sweep.sweep_id}: {len(sweep.candidates)} candidates, {planned['parallel']} at once ≈ "
             f"{planned['usd_per_hour_at_once']:.4g} $/h (bound {sweep.config.max_usd_per_hour:g} $/h); rule sha256 "
             f"{planned['rule_sha256']}")
    records = open_sweep(make_backends(sweep.base).ledger, sweep, actor=actor)
    return {"sweep_id": sweep.sweep_id, "candidates": [c.name for c in sweep.candidates],
            "pending": records.pending(), "rule_sha256": records.opened["rule_sha256"]}


def _opened(sweep_path: str | Path, candidate_name: str | None, *, actor: str):
    """The sweep, the named candidate, the ledger and its records; NotFound before the sweep opened, Conflict when its
    rule changed since, BadInput for a name the sweep does not have."""
    sweep = load_sweep(sweep_path)
    names = [c.name for c in sweep.candidates]
    if candidate_name is not None and candidate_name not in names:
        raise BadInput(f"{sweep.path} has no candidate {candidate_name!r}", fix=f"use one of {', '.join(names)}")
    ledger = make_backends(sweep.base).ledger
    if SweepRecords.read(ledger, sweep.sweep_id).opened is None:
        raise NotFound(f"sweep {sweep.sweep_id} was never opened", fix="run the sweep's open step first")
    records = open_sweep(ledger, sweep, actor=actor)  # opened already: checks the rule, appends nothing
    return sweep, candidate_name and sweep.candidate(candidate_name), ledger, records


def headline(evaluated: dict) -> dict[str, Any]:
    """What a candidate's step returns (XCom, the task's report): its name, release and headline evidence, from
    its `evaluated` entry (`SweepRecords.evaluated`)."""
    metrics = evaluated["evidence"]["metrics"]
    return {"candidate": evaluated["candidate"], "release_id": evaluated["release_id"],
            "gate_decision": evaluated.get("gate_decision"),
            **{key: metrics.get(key) for key in ("accuracy", "valid_rate", "p95_ms", "usd_per_1m_decisions")}}


def evaluate_orchestrated(sweep_path: str | Path, candidate_name: str, *, actor: str,
                          progress: Progress = print_progress) -> dict[str, Any]:
    """One candidate's step: its evidence if the ledger has it (a retry or rerun runs nothing), else, under the
    candidate's lease held by the run's name `actor`, its release from resolve through validate on the sweep's tasks,
    torn down, and its evidence (or failure, raised again) recorded. LeaseHeld at once when another run is evaluating
    it: the step does not hold a worker to wait for that run."""
    sweep, candidate, ledger, records = _opened(sweep_path, candidate_name, actor=actor)
    if candidate.name in records.evaluated:
        progress(f"sweep {sweep.sweep_id}: {candidate.name} already has evidence")
        return headline(records.evaluated[candidate.name])
    payload = evaluate_and_record(sweep, candidate, ledger, load_price_table().once(), actor=actor, holder=actor,
                                  progress=progress)
    return headline(payload)


def teardown_orchestrated(sweep_path: str | Path, candidate_name: str, *, actor: str,
                          progress: Progress = print_progress) -> dict[str, Any]:
    """Tear one candidate down after its step died before doing so itself (a worker lost, a timeout); idempotent.
    Under the candidate's lease, as its evaluation: LeaseHeld, and nothing torn down, while another run evaluates it
    (that run tears it down itself)."""
    sweep, candidate, ledger, _ = _opened(sweep_path, candidate_name, actor=actor)
    if ReleaseState(ledger, candidate.release_id).opened is None:
        return {"candidate": candidate.name, "release_id": candidate.release_id, "teardown": "never opened"}
    with holding_candidate(ledger, sweep, candidate, holder=actor, by_this_process=False, wait_s=0.0,
                           progress=progress):
        return {"candidate": candidate.name, "release_id": candidate.release_id,
                "teardown": _torn_down(sweep, candidate, ledger, actor=actor, progress=progress)}


def _torn_down(sweep: Sweep, candidate: Candidate, ledger, *, actor: str, progress: Progress) -> dict:
    """The candidate's teardown stage, run (it is idempotent) by the caller holding its lease; its record."""
    return ensure_stage_retrying(_candidate_context(sweep, candidate, ledger, actor=actor, progress=progress),
                                 TEARDOWN).record()


def _candidate_context(sweep: Sweep, candidate: Candidate, ledger, *, actor: str, progress: Progress) -> StageContext:
    """The stage context of the candidate's release on its backends, over the sweep's `ledger`."""
    return prepare_release(candidate.config, sweep.base_path, make_backends(candidate.config, ledger=ledger),
                           actor=actor, progress=progress)


def deferred_stage() -> str:
    """The first of a candidate's stages that the policy table defers (`Step.defers`: deploy_candidate)."""
    return next(name for name in STAGES_THROUGH_GATE if table.stage(name).defers is not None)


def start_candidate_orchestrated(sweep_path: str | Path, candidate_name: str, *, actor: str,
                                 progress: Progress = print_progress) -> dict[str, Any]:
    """A deferring orchestrator's first half of a candidate's step: `{"evaluated": headline}` when the ledger has its
    evidence; else, under its lease by the run's name (kept past the step, `_kept_lease`), its stages before
    `deferred_stage` and that stage's start, which returns at once: where to poll it, with `stage` None when there is
    nothing to wait for (the stage already done, the candidate already swept). LeaseHeld at once when another run
    holds the candidate; a failure tears the candidate down, is recorded, and gives the lease back."""
    sweep, candidate, ledger, records = _opened(sweep_path, candidate_name, actor=actor)
    if candidate.name in records.evaluated:
        progress(f"sweep {sweep.sweep_id}: {candidate.name} already has evidence")
        return {"evaluated": headline(records.evaluated[candidate.name])}
    with _kept_lease(ledger, sweep, candidate, actor=actor, progress=progress):
        ctx = _candidate_context(sweep, candidate, ledger, actor=actor, progress=progress)
        ctx.record_opened()
        where = {"candidate": candidate.name, "release_id": candidate.release_id,
                 "ledger_url": ctx.backends.ledger_url, "state_dir": str(ctx.backends.state_dir), "stage": None}
        if ctx.state.status == events.SWEPT:
            return where
        waited = deferred_stage()
        for name in STAGES_THROUGH_GATE[:STAGES_THROUGH_GATE.index(waited)]:
            ensure_stage_retrying(ctx, name)
        started = start_orchestrated(candidate.release_id, waited, ledger_url=where["ledger_url"],
                                     state_dir=where["state_dir"], actor=actor, progress=progress)
        return {**where, "stage": None if "finished" in started else waited}


def poll_candidate_orchestrated(sweep_path: str | Path, candidate_name: str, stage: str, *, actor: str,
                                ledger_url: str | None, state_dir: str | None,
                                progress: Progress = print_progress) -> dict[str, Any]:
    """One poll of the candidate's started `stage` (`poll_orchestrated`: `{"done", "status", "left_s"}`), first renewing
    its lease by the run's name for `LEASE.ttl_s`, so the wait keeps it as a refresh run's poll keeps the model's
    promotion lease; LeaseLost (nothing recorded: the candidate is that run's now) when another run took it over. Done
    at once, renewing nothing, for a candidate with evidence or swept already (a machine polls after every start)."""
    sweep, candidate, ledger, records = _opened(sweep_path, candidate_name, actor=actor)
    if candidate.name in records.evaluated or ReleaseState(ledger, candidate.release_id).status == events.SWEPT:
        return {"done": True, "status": "nothing to wait for: already evaluated", "left_s": 0}
    ledger.renew_lease(candidate_lease_key(candidate), actor, candidate.release_id, table.LEASE.ttl_s)
    return poll_orchestrated(candidate.release_id, stage, ledger_url=ledger_url, state_dir=state_dir, actor=actor,
                             progress=progress)


def finish_candidate_orchestrated(sweep_path: str | Path, candidate_name: str, *, actor: str,
                                  failure: Exception | None = None,
                                  progress: Progress = print_progress) -> dict[str, Any]:
    """A deferring orchestrator's second half of a candidate's step, once its polls end: `evaluate_orchestrated` (the
    deferred stage found done and recorded, then the rest, the teardown and the evidence; the lease given back). With
    the `failure` a poll reported (on the release's record already), the candidate ends as a failed evaluation does:
    torn down, its failure recorded for the sweep (a rerun retries it), the lease given back, the failure raised;
    LeaseHeld instead, nothing torn down, when another run took the candidate over."""
    if failure is None:
        return evaluate_orchestrated(sweep_path, candidate_name, actor=actor, progress=progress)
    sweep, candidate, ledger, _ = _opened(sweep_path, candidate_name, actor=actor)
    with _kept_lease(ledger, sweep, candidate, actor=actor, progress=progress):
        raise failure


@contextlib.contextmanager
def _kept_lease(ledger, sweep: Sweep, candidate: Candidate, *, actor: str, progress: Progress) -> Iterator[None]:
    """Hold the candidate's lease by the run's name (`holding_candidate`: a retry of the run takes it again; LeaseHeld
    at once while another run holds it) while the block runs. A block that ends well keeps it, renewed for
    `LEASE.ttl_s`, which outlives the gap to the run's next step (as a refresh run's promotion lease does); one that
    fails tears the candidate down, records the failure for the sweep and gives the lease back."""
    with holding_candidate(ledger, sweep, candidate, holder=actor, by_this_process=False, wait_s=0.0,
                           progress=progress, kept_for_s=table.LEASE.ttl_s):
        try:
            yield
        except Exception as exc:
            _fail_candidate(sweep, candidate, ledger, exc, actor=actor, progress=progress)
            raise


def _fail_candidate(sweep: Sweep, candidate: Candidate, ledger, exc: Exception, *, actor: str,
                    progress: Progress) -> None:
    """Tear a failed candidate down (`_teardown_quietly`: its own failure is the one recorded, not a teardown's after
    it) and record that failure for the sweep (`sweep/failed`: a rerun retries the candidate), as
    `evaluate_and_record` does."""
    if ReleaseState(ledger, candidate.release_id).opened is not None:
        _teardown_quietly(_candidate_context(sweep, candidate, ledger, actor=actor, progress=progress))
    record_failure(sweep, candidate, ledger, exc, actor=actor, progress=progress)


def pick_orchestrated(sweep_path: str | Path, *, actor: str, progress: Progress = print_progress) -> dict[str, Any]:
    """The pick, once every candidate has evidence (recorded once); NotReady naming the candidates without."""
    sweep, _, ledger, _ = _opened(sweep_path, None, actor=actor)
    return record_pick(ledger, sweep.sweep_id, actor=actor, progress=progress)


def release_pick_orchestrated(sweep_path: str | Path, *, actor: str, fresh_champion: bool = False,
                              progress: Progress = print_progress) -> dict[str, Any]:
    """The pick's own release, as `sweep run --release-pick [--fresh-champion]` runs it (gated on the base's held-out
    datasets); nothing to release (release_id None, and why) when no candidate met the rule."""
    sweep, _, ledger, records = _opened(sweep_path, None, actor=actor)
    recorded = records.recorded_pick()
    if recorded is not None and recorded.picked is None:
        progress(f"sweep {sweep.sweep_id}: no candidate met the rule, so there is no pick to release")
        return {"release_id": None, "skipped": "no candidate met the rule"}
    released = release_pick(ledger, sweep.sweep_id, actor=actor, fresh_champion=fresh_champion, progress=progress)
    return {key: released.get(key) for key in ("release_id", "model", "status", "decision")}
