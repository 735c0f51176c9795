"""The sweep report from the ledger's records alone (`validation.sweep_report`): the frontier, every candidate, the
rule as recorded, and the tasks the pick's own gate runs on (held out from the sweep)."""

from __future__ import annotations

from pathlib import Path

from shiplift.tasks.errors import NotReady
from shiplift.tasks.ledger.sweep_records import SweepRecords, held_out_text
from shiplift.validation.sweep_report import write_sweep_report


def write_report(records: SweepRecords, out_dir: Path) -> dict[str, str]:
    """Write sweep-report.json and report.html for a sweep that picked; NotReady before it has."""
    pick = records.recorded_pick()
    if pick is None:
        raise NotReady(f"sweep {records.sweep_id} has not picked yet: {len(records.pending())} candidates lack "
                       "evidence", fix="run `shiplift sweep run CONFIG` until it picks")
    return write_sweep_report(out_dir, records.rule, pick, records.evidence(), records.champion(),
                              title=f"Sweep {records.opened['name']} ({records.sweep_id})",
                              held_out_split=held_out_text(records.opened), speed=records.speed_scale(),
                              measured=records.measured_evidence())
