"""`--fresh-champion` wherever a release is run besides `shiplift release`: `sweep run --release-pick` hands it to the
pick's release, and an orchestrated begin (the refresh DAG's `fresh_champion` param) records it as the CLI's run does
(`release/options`), so the release's validate stage reads it (`ReleaseState.fresh_champion`)."""

from __future__ import annotations

import pytest

from shiplift.tasks.cli.main import main
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.sweeps.config import load_sweep
from tests.unit.test_sweep_config import write_sweep


def quiet(message: str) -> None:
    """Progress said to nobody."""


@pytest.fixture
def picked_sweep(tmp_path, tiny_release, monkeypatch):
    """A sweep of two candidates whose evaluations are stood in for (tests/e2e/test_sweep_run.py runs real ones), and
    the keyword arguments each release of its pick is asked with (`run_release` stood in)."""
    from shiplift.tasks.sweeps import run as sweep_run
    from shiplift.validation.sweep_rule import CandidateEvidence

    base = tiny_release.write_tiny_config(tmp_path / "releases", tmp_path / "state")
    path = write_sweep(tmp_path / "sweeps", base, axes={"quantization": ["Q8_0", "F16"]})

    def evaluate(sweep, candidate, ledger, table, *, actor, progress):
        evidence = CandidateEvidence(candidate.name, candidate.config_sha256,
                                     {"accuracy": 0.5, "valid_rate": 1.0, "p95_ms": 100.0,
                                      "usd_per_1m_decisions": 0.5})
        return {"candidate": candidate.name, "release_id": candidate.release_id,
                "config_sha256": candidate.config_sha256, "evidence": evidence.to_json(), "champion": None}

    asked = []

    def release(config_path, **kwargs):
        asked.append(kwargs)
        return {"release_id": "tiny-decision-0123456789ab", "status": events.PROMOTED}

    monkeypatch.setattr(sweep_run, "evaluate_candidate", evaluate)
    monkeypatch.setattr(sweep_run, "run_release", release)
    return path, asked


def test_sweep_run_hands_fresh_champion_to_the_pick_s_release(picked_sweep, capsys):
    path, asked = picked_sweep
    assert main(["sweep", "run", str(path), "--release-pick", "--json"]) == 0
    assert main(["sweep", "run", str(path), "--release-pick", "--fresh-champion", "--json"]) == 0
    assert [kwargs["fresh_champion"] for kwargs in asked] == [False, True]


def test_the_sweep_dag_s_release_pick_hands_fresh_champion_to_the_pick_s_release(picked_sweep, capsys):
    """`release_pick_orchestrated` (the sweep DAG's release_pick task, its `fresh_champion` param) passes it on."""
    from shiplift.tasks.sweeps.orchestrated import release_pick_orchestrated

    path, asked = picked_sweep
    assert main(["sweep", "run", str(path), "--json"]) == 0  # evaluated and picked, nothing released
    release_pick_orchestrated(path, actor="dag-run", progress=quiet)
    release_pick_orchestrated(path, actor="dag-run", fresh_champion=True, progress=quiet)
    assert [kwargs["fresh_champion"] for kwargs in asked] == [False, True]


def test_sweep_run_refuses_fresh_champion_without_release_pick_before_anything_runs(picked_sweep, tmp_path, capsys):
    path, asked = picked_sweep
    assert main(["sweep", "run", str(path), "--fresh-champion"]) == 2
    err = capsys.readouterr().err
    assert "only goes with --release-pick" in err and "--release-pick --fresh-champion" in err
    ledger = tmp_path / "state" / "ledger.db"
    assert asked == [] and (not ledger.exists() or Ledger.for_sqlite(ledger).history() == []), "no sweep opened"
    assert load_sweep(path).sweep_id  # the config itself is fine


@pytest.mark.parametrize("fresh", [False, True])
def test_an_orchestrated_begin_records_fresh_champion_once_as_the_cli_s_run_does(tmp_path, tiny_release, fresh):
    """The refresh DAG's begin (`begin_with_options`); begin is retried, so a second begin of the same release records
    nothing more."""
    from shiplift.tasks.orchestrators.run_options import begin_with_options

    config = tiny_release.write_tiny_config(tmp_path / "configs", tmp_path / "state")
    for _ in range(2):
        begun = begin_with_options(config, holder="airflow:refresh_tiny_decision/run-1", fresh_champion=fresh,
                                   progress=quiet)
    ledger = Ledger.for_sqlite(tmp_path / "state" / "ledger.db")
    state = ReleaseState.load(ledger, begun["release_id"])
    options = [r.payload for r in state.records if (r.stage, r.event) == (events.RELEASE, events.OPTIONS)]
    assert state.fresh_champion is fresh
    assert [payload["fresh_champion"] for payload in options] == ([True] if fresh else [])
    ledger.close()
