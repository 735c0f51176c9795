"""A deferring orchestrator's first half of a candidate's step (`start_candidate_orchestrated`) holds the candidate's
lease through `holding_candidate`, as every sweep step does: ended well, the lease stays the run's for the policy
table's `LEASE.ttl_s` (past the gap to the run's next step); failed, the candidate is torn down quietly, its failure
recorded for the sweep and the lease given back. The candidate's stages are faked; the sweep, its ledger and the
leases are real."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from shiplift.tasks.backends.registry import make_backends, open_ledger
from shiplift.tasks.errors import LeaseHeld
from shiplift.tasks.ledger.sweep_records import SweepRecords
from shiplift.tasks.ledger.timestamps import parse_utc, utcnow
from shiplift.tasks.pipeline import release
from shiplift.tasks.pipeline.table import LEASE, TEARDOWN
from shiplift.tasks.sweeps import orchestrated
from shiplift.tasks.sweeps.records import CANDIDATE_LEASE_TTL_S, candidate_lease_key, open_sweep
from tests.unit.test_sfn_sweep import tiny_sweep

RUN, OTHER = "airflow:sweep_tiny/run-1", "airflow:sweep_tiny/run-2"


@pytest.fixture
def sweep(tmp_path, tiny_release):
    """The tiny sweep (candidates Q8_0 and F16), opened in its local ledger."""
    found = tiny_sweep(tmp_path, tiny_release, ledger_url=None)
    ledger = make_backends(found.base).ledger
    open_sweep(ledger, found, actor="opener")
    ledger.close()
    return found


@pytest.fixture
def ledger(sweep):
    opened = open_ledger(state_dir=sweep.base.backend.state_dir)
    yield opened
    opened.close()


def start(sweep, actor: str, said: list[str]) -> dict:
    return orchestrated.start_candidate_orchestrated(sweep.path, "Q8_0", actor=actor, progress=said.append)


def test_a_first_half_that_ends_well_keeps_the_lease_for_the_run_s_next_step(sweep, ledger, monkeypatch):
    ran = []
    monkeypatch.setattr(orchestrated, "ensure_stage_retrying", lambda ctx, name: ran.append(name))
    monkeypatch.setattr(orchestrated, "start_orchestrated", lambda *args, **kwargs: {"started": True})

    assert start(sweep, RUN, [])["stage"] == orchestrated.deferred_stage()
    assert ran and orchestrated.deferred_stage() not in ran

    with pytest.raises(LeaseHeld, match=r"candidate Q8_0 is being evaluated by another run") as refused:
        start(sweep, OTHER, [])
    expires = parse_utc(re.search(r"expires (\S+)\)", str(refused.value)).group(1))
    assert expires - utcnow() > timedelta(seconds=CANDIDATE_LEASE_TTL_S) + timedelta(minutes=5)
    assert expires - utcnow() <= timedelta(seconds=LEASE.ttl_s)
    assert start(sweep, RUN, [])["stage"] == orchestrated.deferred_stage(), "a retry of the same run takes it again"


def test_a_failed_first_half_is_torn_down_quietly_recorded_and_gives_the_lease_back(sweep, ledger, monkeypatch):
    def broken_stage(ctx, name):
        raise RuntimeError(f"{name} broke")

    real_stage = release.ensure_stage_retrying

    def broken_teardown(ctx, name):
        if name == TEARDOWN:
            raise RuntimeError("teardown broke")
        return real_stage(ctx, name)

    monkeypatch.setattr(orchestrated, "ensure_stage_retrying", broken_stage)
    monkeypatch.setattr(release, "ensure_stage_retrying", broken_teardown)
    said: list[str] = []

    with pytest.raises(RuntimeError, match="resolve broke"):
        start(sweep, RUN, said)

    assert any("teardown_candidate after failure also failed: teardown broke" in line for line in said)
    assert "resolve broke" in SweepRecords.read(ledger, sweep.sweep_id).failed["Q8_0"]["error"]
    candidate = sweep.candidate("Q8_0")
    with ledger.acquire_lease(candidate_lease_key(candidate), OTHER, candidate.release_id, CANDIDATE_LEASE_TTL_S):
        pass  # given back: another run takes it at once
