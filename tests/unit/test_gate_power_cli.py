"""`shiplift gate plan` on the shipped configs, the spread measured from recorded gates, and the warning that
`config validate` gives a config whose margin an equally good candidate cannot pass."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from shiplift.tasks.cli.main import main
from shiplift.validation.gate_power import (
    measured_spread,
    narrowest_margin,
    plan_champion_checks,
    score_narrowest_margin,
    score_outcomes,
    score_tasks_needed,
)
from shiplift.validation.thresholds import ChampionRule

QWEN = "configs/releases/qwen35-4b-semif.yaml"
GEMMA = "configs/releases/gemma-decision.yaml"
NARROW_QWEN = ("--set", "validation.champion.margin=0.02")  # the margins the examples shipped with before the plan
OLD_GEMMA = ("--set", "validation.champion.margin=0.05")


def equal_passes(n: int, margin: float, disagreement: float = 0.08) -> str:
    """An equal candidate's P(pass) as the plan prints it (`score_outcomes`, checked against a simulation of the real
    gate in test_gate_power.py)."""
    return f"{outcomes(n, margin, disagreement)['pass']:.2f}"


def outcomes(n: int, margin: float, disagreement: float = 0.08) -> dict[str, float]:
    return score_outcomes(n=n, margin=margin, disagreement=disagreement, shortfall=0.0, confidence=0.95)


def power_fix(n: int, margin: float) -> str:
    """The plan's "narrowest margin or tasks" at the 8 % prior, as its warning prints it."""
    return (f"{score_narrowest_margin(n=n, disagreement=0.08, confidence=0.95):.3f} or "
            f"{score_tasks_needed(margin=margin, disagreement=0.08, confidence=0.95)} tasks")


def plan_json(capsys, config: str, ledger_url: str, *extra: str) -> dict:
    assert main(["gate", "plan", config, "--json", "--ledger-url", ledger_url, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_gate_plan_qwen_says_an_equal_candidate_cannot_pass(capsys, tmp_path):
    # a missing SQLite ledger: qwen's own ledger_url is a Postgres host this machine must not try
    plan = plan_json(capsys, QWEN, f"sqlite:///{tmp_path}/none.db", *NARROW_QWEN)
    accuracy, = plan["checks"]
    assert plan["tasks"] == 111 and plan["ledger"].startswith("no ledger read")
    assert accuracy["spread"]["source"] == "prior" and accuracy["spread"]["disagreement"] == 0.08
    assert accuracy["underpowered"] and accuracy["equal_passes"] < 0.15
    # the score interval takes its variance under the hypothesis (−margin), wider than the Wald interval's at the
    # estimate, so it needs a wider margin than the normal form's (1.96 + 0.8416)·√(0.08/111) = 0.0752 and more than
    # its (2.8016·√0.08/0.02)² = 1570 tasks
    assert accuracy["narrowest_margin"] == pytest.approx(score_narrowest_margin(n=111, disagreement=0.08,
                                                                                confidence=0.95))
    assert accuracy["narrowest_margin"] > narrowest_margin(n=111, sd=math.sqrt(0.08), confidence=0.95)
    assert accuracy["tasks_needed"] == score_tasks_needed(margin=0.02, disagreement=0.08, confidence=0.95) > 1570
    worse = {o["candidate"]: o for o in accuracy["outcomes"]}["worse by the margin"]
    assert 0.01 < worse["pass"] <= 0.025  # the false promotion the 95 % interval allows at the margin, at most


def test_gate_plan_table_for_gemma_and_an_ece_check(capsys, tmp_path):
    assert main(["gate", "plan", GEMMA, "--state-dir", str(tmp_path), *OLD_GEMMA,
                 "--set", "validation.champion.also_ece_margin=0.03"]) == 0
    out = capsys.readouterr().out
    assert "111 paired tasks" in out and "the spread is the stated prior" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("champion_")]
    assert [row[0] for row in rows[:2]] == ["champion_accuracy", "champion_ece"]
    passes, odds = equal_passes(111, 0.05), outcomes(111, 0.05)
    assert ["champion_accuracy", "equal", "0", passes, f"{odds['inconclusive']:.2f}", f"{odds['fail']:.2f}"] in rows
    assert (f"warning: champion_accuracy: an equally good candidate passes with probability {passes} at margin 0.05"
            in out)
    assert power_fix(111, 0.05) in out


def test_gate_plan_measures_the_spread_from_recorded_paired_intervals():
    half = 1.96 * math.sqrt(0.03 / 200)  # a comparison that disagreed on 3 % of 200 tasks, difference 0
    recorded = [{"name": "champion_accuracy", "rule": "paired", "status": "pass", "n": 200, "observed": 0.0,
                 "ci": [-half, half]},
                {"name": "champion_accuracy", "status": "skipped", "n": 0, "observed": None, "ci": None}]
    spread = measured_spread("champion_accuracy", recorded, 0.95)
    assert spread.disagreement == pytest.approx(0.03, rel=1e-3) and spread.source.startswith("ledger: 1 comparison")
    plan, = plan_champion_checks(ChampionRule(margin=0.02), 231, recorded)
    prior, = plan_champion_checks(ChampionRule(margin=0.02), 231)
    # less disagreement, a narrower interval: the measured 3 % passes an equal candidate more often than the 8 % prior
    assert plan.spread == spread and f"{plan.equal_passes:.2f}" == equal_passes(231, 0.02, spread.disagreement)
    assert f"{prior.equal_passes:.2f}" == equal_passes(231, 0.02) and plan.equal_passes > 1.5 * prior.equal_passes


def test_config_validate_warns_about_an_underpowered_margin(capsys):
    assert main(["config", "validate", QWEN, "--json", *NARROW_QWEN]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ok"] is True  # a warning, not a refusal
    assert (f"warning: champion_accuracy: an equally good candidate passes with probability {equal_passes(111, 0.02)} "
            "at margin 0.02" in captured.err)
    assert power_fix(111, 0.02) in captured.err and "widen validation.champion's margin or add tasks" in captured.err
    # 0.08 passed the normal form's 80 % (narrowest 0.075); the score interval needs 0.086 on 111 tasks
    assert main(["config", "validate", QWEN, "--json", "--set", "validation.champion.margin=0.09"]) == 0
    assert "warning" not in capsys.readouterr().err


def prediction(ident: str, right: bool) -> dict:
    """A decision prediction row (the runner's schema) that is right or wrong."""
    return {"id": ident, "dataset": "unit", "expected": "a", "option_ids": ["a", "b"],
            "probabilities": [0.9, 0.1] if right else [0.1, 0.9], "option_logits": None, "allowed_token_mass": 0.9,
            "temperature": 1.0, "latency_ms": 100.0, "server_forward_ms": None, "server_total_ms": None, "attempts": 1,
            "retries_503": 0, "error": None, "started_at": 0.0}


def test_gate_plan_counts_the_disagreement_on_a_recorded_gates_kept_predictions(capsys, tmp_path):
    from shiplift.tasks.backends.local.artifact_store import LocalArtifactStore
    from shiplift.tasks.ledger.events import SUCCEEDED, VALIDATE
    from shiplift.tasks.ledger.store import Ledger

    store = LocalArtifactStore(tmp_path / "artifacts")
    evidence = {}
    # 200 shared tasks: the candidate is right where the champion is wrong on 8 and wrong where it is right on 22
    champion = [i % 4 != 0 for i in range(200)]
    candidate = [not right if i < 30 else right for i, right in enumerate(champion)]
    for name, outcomes in (("predictions.jsonl", candidate), ("champion-predictions.jsonl", champion)):
        path = tmp_path / name
        path.write_text("".join(json.dumps(prediction(f"t{i}", right)) + "\n" for i, right in enumerate(outcomes)))
        evidence[name] = {**store.put_file(path, name=name).to_dict(), "kind": "file"}
    # its recorded interval alone would say 3.5 % (0.03 + 0.07²); the kept outcomes count 30 of 200 = 15 %
    half = 1.96 * math.sqrt(0.03 / 200)
    check = {"name": "champion_accuracy", "rule": "paired", "status": "inconclusive", "n": 200, "observed": -0.07,
             "ci": [-0.07 - half, -0.07 + half]}
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    ledger.append(release_id="r1", model="gemma-decision", stage=VALIDATE, event=SUCCEEDED, actor="test",
                  payload={"checks": [check], "evidence": evidence})
    ledger.close()
    before = sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    accuracy, = plan_json(capsys, GEMMA, f"sqlite:///{tmp_path}/ledger.db", "--state-dir", str(tmp_path))["checks"]
    assert accuracy["spread"]["disagreement"] == pytest.approx(30 / 200)
    assert accuracy["spread"]["source"] == "ledger: 1 comparison(s)' per-task outcomes, 200 tasks"
    assert sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before, "a read-only command wrote"


def test_a_read_only_artifact_read_refuses_a_corrupt_file_and_creates_nothing(tmp_path):
    from shiplift.tasks.backends.local.artifact_store import LocalArtifactStore
    from shiplift.tasks.errors import IntegrityError

    source = tmp_path / "rows.jsonl"
    source.write_text('{"id": "t1"}\n')
    stored = LocalArtifactStore(tmp_path / "artifacts").put_file(source, name="rows.jsonl")
    reader = LocalArtifactStore(tmp_path / "artifacts", create=False)
    assert reader.read_verified(stored.uri, max_bytes=1024) == source.read_bytes()
    with pytest.raises(Exception, match="more than 4 bytes"):
        reader.read_verified(stored.uri, max_bytes=4)
    path = Path(stored.uri.removeprefix("file://"))
    path.chmod(0o644)
    path.write_text('{"id": "t2"}\n')
    with pytest.raises(IntegrityError):
        reader.read_verified(stored.uri, max_bytes=1024)
    LocalArtifactStore(tmp_path / "nowhere", create=False)
    assert not (tmp_path / "nowhere").exists()


def test_release_start_warns_about_an_underpowered_margin(capsys, monkeypatch, tmp_path):
    import shiplift.tasks.pipeline.release as release
    from shiplift.tasks.errors import ShipliftError

    def stop_here(*args, **kwargs):
        raise ShipliftError("stopped after the start")  # the warning is printed before the release runs

    monkeypatch.setattr(release, "run_release", stop_here)
    assert main(["release", GEMMA, "--state-dir", str(tmp_path), *OLD_GEMMA]) == 1
    err = capsys.readouterr().err
    assert (f"warning: champion_accuracy: an equally good candidate passes with probability {equal_passes(111, 0.05)} "
            "at margin 0.05" in err)
    assert err.index("warning") < err.index("stopped after the start")
