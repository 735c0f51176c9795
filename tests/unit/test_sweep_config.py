"""Sweep configs (tasks.sweeps.config): candidates as ordinary release configs, and what a sweep refuses at load (tasks
shared with the base's gate, an axis it does not have, a quantization the family cannot build, a rule changed after the
sweep opened, candidates dearer than the bound); `sweep plan` writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from shiplift.tasks.backends.pricing import load_price_table
from shiplift.tasks.cli.main import main
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import ConfigError, Conflict
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.ledger.sweep_records import SweepRecords
from shiplift.tasks.sweeps.config import load_sweep
from shiplift.tasks.sweeps.records import open_sweep
from shiplift.tasks.sweeps.run import check_cost, plan

ROOT = Path(__file__).resolve().parents[2]
RULE = {"constraints": [{"metric": "valid_rate", "at_least": 1.0}],
        "objective": [{"metric": "usd_per_1m_decisions", "direction": "min"}, {"metric": "p95_ms", "direction": "min"}]}
C7I = {"kind": "instance_type", "instance_type": "ml.c7i.xlarge"}
G6E = {"kind": "instance_type", "instance_type": "ml.g6e.xlarge"}


@pytest.fixture
def base(tmp_path, tiny_release) -> Path:
    """A tiny release config gated on 32 test tasks of the decision set (a copy in its own file)."""
    return tiny_release.write_tiny_config(tmp_path / "releases", tmp_path / "state")


def write_sweep(folder: Path, base: Path, **fields) -> Path:
    tree = {"name": "tiny-sweep", "base": str(Path("..") / base.parent.name / base.name),
            "axes": {"quantization": ["Q8_0", "F16"], "placement": [C7I, G6E]},
            "datasets": [{"path": "builtin:decisions", "splits": ["calibration"]}],
            "rule": RULE, "max_usd_per_hour": 10.0, **fields}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny-sweep.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_candidates_are_release_configs_of_the_base(tmp_path, base):
    sweep = load_sweep(write_sweep(tmp_path / "sweeps", base))
    assert [c.name for c in sweep.candidates] == ["Q8_0-ml.c7i.xlarge", "Q8_0-ml.g6e.xlarge", "F16-ml.c7i.xlarge",
                                                  "F16-ml.g6e.xlarge"]
    assert len({c.release_id for c in sweep.candidates}) == 4
    first = sweep.candidates[0]
    # the same config `shiplift release BASE --set …` loads, gated on the sweep's tasks
    again = load_release_config(base, overrides=first.overrides + sweep.sweep_overrides)
    assert again.config_hash() == first.config_sha256
    assert first.config.artifact.quantization == "Q8_0" and first.config.placement.instance_type == "ml.c7i.xlarge"
    assert [(d.path, d.splits) for d in first.config.validation.datasets] == [("builtin:decisions", ["calibration"])]
    # the pick is released with the axis values only: its gate reads the base's own datasets
    released = load_release_config(base, overrides=first.overrides)
    assert released.validation.datasets == sweep.base.validation.datasets
    assert sweep.sweep_id.startswith("sweep-tiny-sweep-")


def test_an_explicit_list_keeps_the_base_where_it_names_nothing(tmp_path, base):
    path = write_sweep(tmp_path / "sweeps", base, axes=None,
                       candidates=[{"quantization": "F16"}, {"placement": G6E}])
    sweep = load_sweep(path)
    assert [c.name for c in sweep.candidates] == ["F16", "ml.g6e.xlarge"]
    assert sweep.candidates[1].config.artifact.quantization == sweep.base.artifact.quantization == "Q8_0"


def test_tasks_shared_with_the_base_gate_are_refused_whatever_file_holds_them(tmp_path, base):
    # the base gates on a copy of 32 test tasks in its own file; the sweep names the built-in set's test split
    path = write_sweep(tmp_path / "sweeps", base, datasets=[{"path": "builtin:decisions", "splits": ["test"]}])
    with pytest.raises(ConfigError) as refused:
        load_sweep(path)
    text = str(refused.value)
    assert "shares 32 of its 111 tasks with the base's validation.datasets[0]" in text
    assert "never reads" in text and "fix:" in text


def test_a_sweep_dataset_path_is_read_from_the_sweep_folder(tmp_path, base):
    rows = [line for line in (ROOT / "validation/data/decisions.jsonl").read_text().splitlines()
            if json.loads(line)["split"] == "calibration"][:12]
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "mine.jsonl").write_text("\n".join(rows) + "\n")
    sweep = load_sweep(write_sweep(tmp_path / "sweeps", base, datasets=[{"path": "mine.jsonl"}]))
    # named relative to the base's folder, so release ids do not depend on where the checkout lives
    assert sweep.candidates[0].config.validation.datasets[0].path == "../sweeps/mine.jsonl"


def test_a_source_axis_compares_models_and_a_missing_source_is_refused(tmp_path, base):
    tree = yaml.safe_load(base.read_text())
    generated = tree["artifact"]["source"]
    on_disk = {"kind": "path", "path": "tiny-seed3.gguf", "sha256": generated["sha256"]}  # beside the base config
    sweep = load_sweep(write_sweep(tmp_path / "sweeps", base, axes={"source": [generated, on_disk]}))
    assert [c.name for c in sweep.candidates] == [f"generated-{generated['sha256']}"[:40], "path-tiny-seed3.gguf"]
    assert sweep.candidates[1].config.artifact.source.kind == "path"
    missing = {**on_disk, "path": "no-such.gguf"}
    with pytest.raises(ConfigError) as refused:
        load_sweep(write_sweep(tmp_path / "sweeps", base, axes={"source": [generated, missing]}))
    assert "artifact.source.path 'no-such.gguf': no such file" in str(refused.value)


@pytest.mark.parametrize(("fields", "expected"), [
    ({"axes": {"quantisation": ["F16"]}}, "axes.quantisation: unknown key (a sweep varies only source, "
                                           "quantization, placement) — fix: rename it to axes.quantization"),
    ({"axes": {"batch": [1, 8]}}, "axes.batch: unknown key"),
    ({"axes": {"quantization": ["Q3_K"]}}, "quantization 'Q3_K' is not one GgufDecisions can build"),
    ({"axes": None}, "candidates: product needs axes"),
    ({"candidates": [{"quantization": "F16"}, {"quantization": "F16"}], "axes": None}, "are the same release config"),
    ({"axes": {"quantization": ["F16"]}}, "names 1 candidates; a sweep compares 2 to 64"),
    ({"axes": {"placement": [{"kind": "instance_type", "instance_type": "c7i.xlarge"}, C7I]}},
     "is not a valid release config of tiny-decision.yaml"),
    ({"rule": {"constraints": [], "objective": [{"metric": "p95_ms", "direction": "max"}]}}, "write direction: min"),
])
def test_a_sweep_that_cannot_run_as_written_is_refused_at_load(tmp_path, base, fields, expected):
    with pytest.raises(ConfigError) as refused:
        load_sweep(write_sweep(tmp_path / "sweeps", base, **fields))
    assert expected in str(refused.value)


def test_a_rule_changed_after_the_sweep_opened_is_refused(tmp_path, base):
    ledger = Ledger.for_sqlite(tmp_path / "ledger.sqlite")
    sweep = load_sweep(write_sweep(tmp_path / "sweeps", base))
    opened = open_sweep(ledger, sweep, actor="tester")
    assert opened.opened["rule_sha256"] == sweep.config.rule.sha256()
    assert [c["config_sha256"] for c in opened.candidates] == [c.config_sha256 for c in sweep.candidates]
    assert open_sweep(ledger, sweep, actor="tester").opened_at == opened.opened_at  # reopened, not opened twice
    looser = {**RULE, "constraints": []}
    changed = load_sweep(write_sweep(tmp_path / "sweeps", base, rule=looser))
    assert changed.sweep_id == sweep.sweep_id  # the same candidates: the same sweep
    with pytest.raises(Conflict) as refused:
        open_sweep(ledger, changed, actor="tester")
    assert "a changed rule is a new sweep" in str(refused.value)
    assert len(ledger.release(sweep.sweep_id)) == 1
    renamed = load_sweep(write_sweep(tmp_path / "sweeps", base, rule=looser, name="tiny-sweep-2"))
    assert SweepRecords.read(ledger, renamed.sweep_id).opened is None
    ledger.close()


def test_candidates_dearer_than_the_bound_are_refused(tmp_path, base):
    sweep = load_sweep(write_sweep(tmp_path / "sweeps", base, max_usd_per_hour=2.5))
    table = load_price_table()
    planned = plan(sweep, parallel=1, table=table)
    check_cost(sweep, planned)  # one at a time: the dearest alone, ml.g6e.xlarge
    assert planned["usd_per_hour_at_once"] == max(r["usd_per_hour"] for r in planned["candidates"])
    at_once = plan(sweep, parallel=4, table=table)
    assert at_once["usd_per_hour_at_once"] == pytest.approx(sum(r["usd_per_hour"] for r in at_once["candidates"]))
    with pytest.raises(ConfigError) as refused:
        check_cost(sweep, at_once)
    assert "above max_usd_per_hour 2.5" in str(refused.value)


def test_sweep_plan_writes_nothing(tmp_path, base, capsys):
    path = write_sweep(tmp_path / "sweeps", base)
    before = sorted(p for p in tmp_path.rglob("*"))
    assert main(["sweep", "plan", str(path), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in planned["candidates"]][:1] == ["Q8_0-ml.c7i.xlarge"]
    assert planned["rule_sha256"] == load_sweep(path).config.rule.sha256()
    assert sorted(p for p in tmp_path.rglob("*")) == before
    assert not (tmp_path / "state").exists()


def test_the_example_sweep_plans(capsys):
    path = ROOT / "configs" / "sweeps" / "gemma-decision-quant.yaml"
    assert main(["sweep", "plan", str(path)]) == 0
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines() if line.startswith(("as-source ", "Q4_0 ", "Q8_0 "))]
    assert names == ["as-source", "Q4_0", "Q8_0"] and "rule_sha256" in out


def test_the_run_loop_records_failures_picks_once_all_have_evidence_and_explain_checks_the_pick(
        tmp_path, base, monkeypatch, capsys):
    """The loop's bookkeeping, with each candidate's evaluation stood in for (tests/e2e/test_sweep_run.py runs real
    ones): a failure is recorded and nothing is picked; a rerun evaluates only what lacks evidence, then picks; a
    picked record the rule does not give is what `sweep explain` reports (exit 3)."""
    from shiplift.tasks.errors import ShipliftError
    from shiplift.tasks.ledger import events
    from shiplift.tasks.sweeps import run as sweep_run
    from shiplift.validation.sweep_rule import CandidateEvidence

    sweep = load_sweep(write_sweep(tmp_path / "sweeps", base, axes={"quantization": ["Q8_0", "F16"]}))
    cost = {"Q8_0": 0.5, "F16": 0.9}  # $ per 1M decisions: Q8_0 is the cheaper
    calls, broken = [], {"F16"}

    def evaluate(sweep_, candidate, ledger, table, *, actor, progress):
        calls.append(candidate.name)
        if candidate.name in broken:
            raise ShipliftError("build: out of disk", fix="free some")
        evidence = CandidateEvidence(candidate.name, candidate.config_sha256,
                                     {"accuracy": 0.5, "valid_rate": 1.0, "p95_ms": 100.0,
                                      "usd_per_1m_decisions": cost[candidate.name]})
        return {"candidate": candidate.name, "release_id": candidate.release_id,
                "config_sha256": candidate.config_sha256, "evidence": evidence.to_json(), "champion": None}

    monkeypatch.setattr(sweep_run, "evaluate_candidate", evaluate)
    with pytest.raises(ShipliftError) as failed:
        sweep_run.run_sweep(sweep, parallel=2, progress=lambda message: None)
    assert "1 of 2 candidates failed: F16: build: out of disk" in str(failed.value)
    ledger = Ledger.for_sqlite(tmp_path / "state" / "ledger.db")
    records = SweepRecords.load(ledger, sweep.sweep_id)
    assert list(records.evaluated) == ["Q8_0"] and list(records.failed) == ["F16"] and records.picked is None

    broken.clear()
    result = sweep_run.run_sweep(load_sweep(sweep.path), progress=lambda message: None)
    assert sorted(calls[:2]) == ["F16", "Q8_0"] and calls[2:] == ["F16"]  # only the failed one again
    assert result["picked"] == "Q8_0" and result["frontier"] == ["Q8_0"]
    assert [r.event for r in ledger.release(sweep.sweep_id)].count(events.PICKED) == 1

    state_dir = str(tmp_path / "state")
    assert main(["sweep", "explain", "tiny-sweep", "--state-dir", state_dir]) == 0
    assert "dominated by Q8_0 (cheaper per decision" in capsys.readouterr().out
    wrong = {"rule_sha256": sweep.config.rule.sha256(), "picked": "F16", "frontier": ["F16"],
             "verdicts": [{"name": "F16", "status": "picked", "reason": "edited"}]}
    ledger.append(release_id=sweep.sweep_id, model=sweep.base.name, stage=events.SWEEP, event=events.PICKED,
                  payload={"pick": wrong}, actor="someone")
    assert main(["sweep", "explain", sweep.sweep_id, "--state-dir", state_dir, "--json"]) == 3
    found = json.loads(capsys.readouterr().out)
    assert found["agrees"] is False and found["derived_pick"]["picked"] == "Q8_0"
    ledger.close()
