"""Opening a sweep in the ledger: the rule and the candidates recorded before any candidate is evaluated (reading the
records back: `tasks.ledger.sweep_records`)."""

from __future__ import annotations

from shiplift.tasks.errors import Conflict
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.sweep_records import SweepRecords
from shiplift.tasks.sweeps.config import Sweep


def opening(sweep: Sweep) -> dict:
    """The `sweep/opened` payload: the rule and its sha256, every candidate's config sha256 and how it is made from the
    base, the tasks they are compared on and the bound on their cost."""
    config = sweep.config
    return {"sweep_id": sweep.sweep_id, "name": config.name, "model": sweep.base.name,
            "sweep_path": str(sweep.path.resolve()),
            "base_path": str(sweep.base_path), "base_config_hash": sweep.base.config_hash(),
            "rule": config.rule.canonical(), "rule_sha256": config.rule.sha256(),
            "datasets": [ref.model_dump(mode="json", exclude_none=True) for ref in config.datasets],
            "held_out": [ref.model_dump(mode="json", exclude_none=True) for ref in sweep.base.validation.datasets],
            "max_usd_per_hour": config.max_usd_per_hour, "sweep_overrides": list(sweep.sweep_overrides),
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

