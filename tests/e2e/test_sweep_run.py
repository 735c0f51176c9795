"""A sweep run end to end on the local backend with tiny generated GGUF models (tasks.sweeps.run): the sweep opens
before any candidate is evaluated, every candidate is gated on the sweep's tasks and torn down, the pick is recorded,
`sweep explain` re-derives it from the ledger alone, and a rerun changes nothing. The slow test adds a champion (the
rule's paired interval) and releases the pick on the base's own gate tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.backends.registry import open_ledger
from shiplift.tasks.cli.main import main
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.sweep_records import SweepRecords, explanation
from shiplift.tasks.sweeps.config import load_sweep
from shiplift.tasks.sweeps.run import run_sweep

ROOT = Path(__file__).resolve().parents[2]
CHEAPEST_FIRST = [{"metric": "usd_per_1m_decisions", "direction": "min"}, {"metric": "p95_ms", "direction": "min"}]


def quiet(message: str) -> None:
    """Progress lines are not what these tests read."""


def write_sweep(folder: Path, base: Path, *, n_tasks: int, constraints: list[dict]) -> Path:
    """A sweep of two builds of the tiny model (Q8_0, F16) compared on `n_tasks` calibration tasks of the decision
    set, which the tiny base's gate (its test tasks) never reads."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [line for line in (ROOT / "validation/data/decisions.jsonl").read_text().splitlines()
            if json.loads(line)["split"] == "calibration"][:n_tasks]
    (folder / "sweep-tasks.jsonl").write_text("\n".join(rows) + "\n")
    tree = {"name": "tiny-sweep", "base": str(Path("..") / base.parent.name / base.name),
            "axes": {"quantization": ["Q8_0", "F16"]}, "datasets": [{"path": "sweep-tasks.jsonl"}],
            "rule": {"constraints": constraints, "objective": CHEAPEST_FIRST}, "max_usd_per_hour": 1.0}
    path = folder / "tiny-sweep.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_a_sweep_picks_from_its_ledger_records_and_a_rerun_changes_nothing(tmp_path, release_config, capsys):
    base = release_config()
    sweep = load_sweep(write_sweep(tmp_path / "sweeps", base, n_tasks=12,
                                   constraints=[{"metric": "valid_rate", "at_least": 1.0}]))
    result = run_sweep(sweep, parallel=2, progress=quiet)

    assert result["picked"] in {"Q8_0", "F16"} and result["picked"] in result["frontier"]
    ledger = open_ledger(state_dir=tmp_path / "state")
    own = ledger.release(sweep.sweep_id)
    assert [r.event for r in own] == [events.OPENED, events.EVALUATED, events.EVALUATED, events.PICKED]
    assert own[0].payload["rule_sha256"] == sweep.config.rule.sha256()
    for candidate in sweep.candidates:
        state = ReleaseState.load(ledger, candidate.release_id)
        assert own[0].seq < state.records[0].seq  # opened before any candidate ran
        assert state.status == events.SWEPT and state.stage(events.PROMOTE)["status"] == "pending"
        assert state.stage(events.DEPLOY_CANDIDATE)["status"] == "torn_down"
        evidence = SweepRecords.load(ledger, sweep.sweep_id).evaluated[candidate.name]["evidence"]
        assert evidence["config_sha256"] == candidate.config_sha256
        assert evidence["metrics"]["usd_per_hour"] == pytest.approx(0.214)  # ml.c7i.xlarge, nominally
        assert evidence["metrics"]["usd_per_1m_decisions"] > 0 and evidence["metrics"]["valid_rate"] == 1.0
    assert ProcessSupervisor(tmp_path / "state").list_endpoints() == []  # every candidate torn down

    found = explanation(SweepRecords.load(ledger, sweep.sweep_id))
    assert found["agrees"] and found["derived_pick"]["picked"] == result["picked"]
    assert found["speed"]["basis"] == "as_measured" and "no champion was timed beside" in found["speed"]["note"]
    assert {v["status"] for v in found["verdicts"]} <= {"picked", "frontier", "dominated"}

    head = ledger.head().seq
    again = run_sweep(load_sweep(sweep.path), parallel=2, progress=quiet)
    assert again["picked"] == result["picked"] and ledger.head().seq == head  # nothing evaluated or recorded twice

    state_dir = str(tmp_path / "state")
    capsys.readouterr()
    assert main(["sweep", "explain", sweep.sweep_id[:20], "--state-dir", state_dir, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["agrees"] is True
    assert main(["sweep", "report", sweep.sweep_id, "--state-dir", state_dir, "--out", str(tmp_path / "report"),
                 "--json"]) == 0
    report = json.loads((tmp_path / "report" / "sweep-report.json").read_text())
    assert report["pick"]["picked"] == result["picked"] and report["rule_sha256"] == sweep.config.rule.sha256()
    assert "decisions-small.jsonl" in report["held_out_split"]  # the base's gate tasks: the pick's own gate
    assert ledger.head().seq == head  # explain and report read the ledger only
    ledger.close()


@pytest.mark.slow
def test_a_sweep_against_a_champion_releases_its_pick_on_held_out_tasks(tmp_path, release_config, capsys):
    from shiplift.tasks.pipeline.release import run_release

    base = release_config()
    champion = run_release(base, progress=quiet)
    assert champion["status"] == events.PROMOTED
    path = write_sweep(tmp_path / "sweeps", base, n_tasks=30,
                       constraints=[{"metric": "valid_rate", "at_least": 1.0},
                                    {"metric": "accuracy", "not_worse_than_champion_by": 0.5}])
    assert main(["sweep", "run", str(path), "--parallel", "2", "--release-pick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sweep = load_sweep(path)
    ledger = open_ledger(state_dir=tmp_path / "state")
    records = SweepRecords.load(ledger, sweep.sweep_id)
    for payload in records.evaluated.values():
        assert payload["champion_release"] == champion["release_id"]
        assert "accuracy_vs_champion" in payload["evidence"]["intervals"]
    assert records.champion() is not None
    scale = records.speed_scale()  # both gates timed the champion: speeds judged side by side
    assert scale.basis == "side_by_side" and set(scale.loads) == set(records.evaluated)
    assert sorted(scale.champion_p50_ms.values())[0] <= scale.reference_ms <= max(scale.champion_p50_ms.values())
    released = out["release"]
    assert records.handed_off["release_id"] == released["release_id"]
    picked = sweep.candidate(out["picked"])
    gate = ReleaseState.load(ledger, released["release_id"]).result(events.VALIDATE)
    assert [Path(d["path"]).name for d in gate.datasets] == ["decisions-small.jsonl"]  # the base's, not the sweep's
    assert released["release_id"] != picked.release_id
    assert explanation(records)["agrees"]
    ledger.close()
