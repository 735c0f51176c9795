"""Opening a sweep in the ledger: the rule and the candidates recorded before any candidate is evaluated (reading the
records back: `tasks.ledger.sweep_records`); and each candidate's lease, so that two runs of a sweep (two `sweep run`s,
or one beside an Airflow or Step Functions run) never evaluate the same candidate at once."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from shiplift.tasks.errors import Conflict, LeaseHeld
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.leases import Lease, renewing
from shiplift.tasks.ledger.sweep_records import SweepRecords
from shiplift.tasks.pipeline.release import Progress, stopped_holder
from shiplift.tasks.pipeline.table import LEASE
from shiplift.tasks.sweeps.config import Candidate, Sweep
from shiplift.validation.sweep_speed import SIDE_BY_SIDE


def opening(sweep: Sweep) -> dict:
    """The `sweep/opened` payload: the rule and its sha256, every candidate's config sha256 and how it is made from the
    base, the tasks they are compared on, the bound on their cost, and that their speeds are judged side by side
    (`validation.sweep_speed`: a sweep opened without `speed` judged them as measured, and its records still do)."""
    config = sweep.config
    return {"sweep_id": sweep.sweep_id, "name": config.name, "model": sweep.base.name,
            "sweep_path": str(sweep.path.resolve()),
            "base_path": str(sweep.base_path), "base_config_hash": sweep.base.config_hash(),
            "rule": config.rule.canonical(), "rule_sha256": config.rule.sha256(),
            "datasets": [ref.model_dump(mode="json", exclude_none=True) for ref in config.datasets],
            "held_out": [ref.model_dump(mode="json", exclude_none=True) for ref in sweep.base.validation.datasets],
            "max_usd_per_hour": config.max_usd_per_hour, "sweep_overrides": list(sweep.sweep_overrides),
            "speed": SIDE_BY_SIDE,
            "candidates": [{"name": c.name, "release_id": c.release_id, "config_sha256": c.config_sha256,
                            "values": c.values, "overrides": list(c.overrides)} for c in sweep.candidates]}


def open_sweep(ledger, sweep: Sweep, *, actor: str) -> SweepRecords:
    """Open the sweep in the ledger before any candidate is evaluated, or find it open; Conflict when it was opened
    under another rule (a changed rule is a new sweep)."""
    found = SweepRecords.read(ledger, sweep.sweep_id)
    sha = sweep.config.rule.sha256()
    if found.opened is None:
        ledger.append(release_id=sweep.sweep_id, model=sweep.base.name, stage=events.SWEEP, event=events.OPENED,
                      payload=opening(sweep), actor=actor)
        return SweepRecords.load(ledger, sweep.sweep_id)
    if found.opened["rule_sha256"] != sha:
        raise Conflict(f"sweep {sweep.sweep_id} was opened at {found.opened_at} by {found.opened_by} under rule sha256 "
                       f"{found.opened['rule_sha256'][:12]}…, but {sweep.path} now gives rule sha256 {sha[:12]}…: a "
                       "rule changed after the sweep opened would be judged on evidence already seen",
                       fix="restore the rule as it was (`shiplift sweep explain` prints it), or give the sweep a new "
                           "name: a changed rule is a new sweep")
    return found


# A candidate's lease lasts three renewals: its holder renews it every LEASE.renew_every_s while it evaluates, so a
# holder that crashed frees it within this long (and at once, on the same host, when its process is gone).
CANDIDATE_LEASE_TTL_S = 3 * LEASE.renew_every_s
# How often a run that waits for another run's candidate looks at its lease again.
CANDIDATE_POLL_S = 30.0


def candidate_lease_key(candidate: Candidate) -> str:
    """The name a candidate's lease is kept under in the ledger's leases table: its release id, behind a prefix no
    model's name can have (a `/`), so it never stands in the way of a model's promotion lease."""
    return f"sweep-candidate/{candidate.release_id}"


@contextlib.contextmanager
def holding_candidate(ledger, sweep: Sweep, candidate: Candidate, *, holder: str, by_this_process: bool,
                      wait_s: float, progress: Progress, kept_for_s: float | None = None) -> Iterator[Lease]:
    """Hold the candidate's lease (the promotion lease's table and rules, keyed by the candidate's release, not by
    model: other candidates go on in parallel) while the block evaluates it, renewing it as it runs; leaving gives it
    back, unless `kept_for_s` is set and the block ended well: then the lease stays held, renewed for that long (an
    orchestrator's step that leaves the candidate to the run's next step). `by_this_process`: a CLI run's lease (its
    host and pid; a stopped run of it is taken over at once); else an orchestrator's, held by `holder`'s name (a retry
    of the same run takes it again). Held by another run: look again every CANDIDATE_POLL_S for up to `wait_s` seconds
    (a holder that crashed frees it within CANDIDATE_LEASE_TTL_S), then LeaseHeld naming the holder. The block must
    re-read the ledger: the holder may have recorded the evidence."""
    key, deadline, said = candidate_lease_key(candidate), time.monotonic() + wait_s, False
    while True:
        try:
            lease = ledger.acquire_lease(key, holder, candidate.release_id, CANDIDATE_LEASE_TTL_S,
                                         stopped=stopped_holder, by_this_process=by_this_process)
            break
        except LeaseHeld as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LeaseHeld(f"sweep {sweep.sweep_id}: candidate {candidate.name} is being evaluated by another "
                                f"run, and a candidate is never evaluated twice at once ({exc.problem})",
                                fix="let that run record the candidate's evidence, then run this step or `shiplift "
                                    "sweep run` again (a candidate with evidence is not evaluated again); a run that "
                                    f"crashed frees it within {CANDIDATE_LEASE_TTL_S / 60:.0f} min") from exc
            if not said:
                progress(f"sweep {sweep.sweep_id}: {candidate.name} is being evaluated by another run; waiting up to "
                         f"{left:.0f} s for its evidence")
                said = True
            time.sleep(min(CANDIDATE_POLL_S, left))
    if lease.taken_over is not None:
        progress(f"sweep {sweep.sweep_id}: took {candidate.name} over from {lease.taken_over[0]!r}: "
                 f"{lease.taken_over[1]}")
    with contextlib.ExitStack() as giving_back:
        giving_back.enter_context(lease)
        with renewing_candidate(ledger, lease, progress):
            yield lease
        if kept_for_s is not None:
            ledger.renew_lease(lease.model, lease.holder, lease.release_id, kept_for_s, token=lease.token)
            giving_back.pop_all()


def renewing_candidate(ledger, lease: Lease, progress: Progress) -> contextlib.AbstractContextManager[None]:
    """Renew the candidate's `lease` every LEASE.renew_every_s while the block runs (`leases.renewing`)."""
    return renewing(lambda: ledger.renew_lease(lease.model, lease.holder, lease.release_id, CANDIDATE_LEASE_TTL_S,
                                               token=lease.token),
                    every_s=LEASE.renew_every_s, say=progress, name=f"lease-{lease.model}")
