"""A sweep's speeds side by side (validation.sweep_speed): each candidate's latencies and $ per 1M decisions divided by
its gate's load factor, read off the champion timed in the same gate, so a candidate gated on a busy machine does not
lose to one gated on an idle one; as measured, with the reason, where the gates share no champion. The reference
values below are worked by hand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from shiplift.tasks.errors import BadInput
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.ledger.sweep_records import SweepRecords, explanation
from shiplift.tasks.sweeps.records import open_sweep, opening
from shiplift.tasks.sweeps.report import write_report
from shiplift.tasks.sweeps.run import record_pick
from shiplift.validation.sweep_rule import CandidateEvidence, SelectionRule, choose
from shiplift.validation.sweep_speed import AS_MEASURED, SIDE_BY_SIDE, GateWindow, on_one_scale, scaled_champion
from tests.e2e.test_sweep_run import write_sweep

FASTEST = SelectionRule.model_validate({"constraints": [], "objective": [{"metric": "p95_ms", "direction": "min"}]})


def quiet(message: str) -> None:
    """Progress lines are not what these tests read."""


def evidence(name: str, p95: float, usd_per_1m: float, accuracy: float = 0.7) -> CandidateEvidence:
    return CandidateEvidence(name, f"sha-{name}", {"accuracy": accuracy, "p50_ms": p95 / 2, "p95_ms": p95,
                                                   "usd_per_hour": 0.2, "usd_per_1m_decisions": usd_per_1m},
                             {"accuracy": (accuracy - 0.1, accuracy + 0.1), "p95_ms": (p95 * 0.9, p95 * 1.1),
                              "p95_ms_vs_champion": (-10.0, 30.0), "accuracy_vs_champion": (-0.05, 0.02)})


def test_each_candidate_is_divided_by_its_gate_s_load_factor():
    # champion medians 100, 200, 150 ms: reference (median) 150, loads 2/3, 4/3, 1
    candidates = [evidence("a", 120.0, 6.0), evidence("b", 260.0, 13.0), evidence("c", 180.0, 9.0)]
    windows = {"a": GateWindow("champ-1", 100.0), "b": GateWindow("champ-1", 200.0),
               "c": GateWindow("champ-1", 150.0)}
    scaled, scale = on_one_scale(candidates, windows)

    assert scale.basis == SIDE_BY_SIDE and scale.reference_ms == 150.0
    assert scale.loads == pytest.approx({"a": 2 / 3, "b": 4 / 3, "c": 1.0})
    by_name = {e.name: e for e in scaled}
    assert by_name["a"].metrics["p95_ms"] == pytest.approx(180.0)  # 120 / (2/3)
    assert by_name["b"].metrics["p95_ms"] == pytest.approx(195.0)  # 260 / (4/3)
    assert by_name["b"].metrics["p50_ms"] == pytest.approx(97.5)
    assert by_name["b"].metrics["usd_per_1m_decisions"] == pytest.approx(9.75)
    assert by_name["b"].intervals["p95_ms"] == pytest.approx((175.5, 214.5))
    assert by_name["b"].intervals["p95_ms_vs_champion"] == pytest.approx((-7.5, 22.5))
    for name in "abc":  # what load does not change is left as measured
        original = next(e for e in candidates if e.name == name)
        assert by_name[name].metrics["accuracy"] == original.metrics["accuracy"]
        assert by_name[name].metrics["usd_per_hour"] == original.metrics["usd_per_hour"]
        assert by_name[name].intervals["accuracy_vs_champion"] == original.intervals["accuracy_vs_champion"]
    assert "150 ms" in scale.note and "0.6667–1.333" in scale.note


def test_a_candidate_gated_on_a_busy_machine_no_longer_loses_to_one_gated_on_an_idle_one():
    # `quick` answers in 0.8x the champion's time, `slow` in 1.0x; quick was gated while the machine ran at half speed
    quick, slow = evidence("quick", 1600.0, 20.0), evidence("slow", 1000.0, 12.5)
    windows = {"quick": GateWindow("champ-1", 2000.0), "slow": GateWindow("champ-1", 1000.0)}
    assert choose(FASTEST, [quick, slow]).picked == "slow"  # as measured, the load decides
    scaled, _ = on_one_scale([quick, slow], windows)
    assert choose(FASTEST, scaled).picked == "quick"  # side by side, the candidate does
    assert {e.name: e.metrics["p95_ms"] for e in scaled} == pytest.approx({"quick": 1200.0, "slow": 1500.0})


@pytest.mark.parametrize(("windows", "why"), [
    ({"a": GateWindow(None, None), "b": GateWindow("champ-1", 90.0)}, "no champion was timed beside a"),
    ({"a": GateWindow("champ-1", 80.0), "b": GateWindow("champ-2", 90.0)}, "the champion changed during the sweep"),
])
def test_without_a_common_champion_speeds_stay_as_measured_and_the_note_says_why(windows, why):
    candidates = [evidence("a", 100.0, 5.0), evidence("b", 200.0, 9.0)]
    scaled, scale = on_one_scale(candidates, windows)
    assert scaled == candidates and scale.basis == AS_MEASURED and why in scale.note
    assert scale.loads == {"a": 1.0, "b": 1.0}
    assert scaled_champion(evidence("champ", 90.0, 4.0), windows["b"], scale).metrics["p95_ms"] == 90.0


def test_the_champion_is_drawn_at_the_reference_scale():
    candidates = [evidence("a", 120.0, 6.0), evidence("b", 260.0, 13.0)]
    windows = {"a": GateWindow("champ-1", 100.0), "b": GateWindow("champ-1", 300.0)}
    _, scale = on_one_scale(candidates, windows)  # reference 200 ms, a's load 0.5
    champion = evidence("champion", 140.0, 7.0)
    assert scaled_champion(champion, windows["a"], scale).metrics["p95_ms"] == pytest.approx(280.0)


def test_one_read_of_a_sweep_puts_its_speeds_on_one_scale_once(monkeypatch):
    """What a summary, a report and `explain` ask of one read (the evidence, the scale, the champion) comes of one pass
    over the evaluated payloads; the records are frozen, so that pass cannot go stale, and a caller's list is its
    own."""
    from shiplift.tasks.ledger import sweep_records

    passes = []

    def counted(*args):
        passes.append(args)
        return on_one_scale(*args)

    monkeypatch.setattr(sweep_records, "on_one_scale", counted)
    evaluated = {name: {"candidate": name, "evidence": evidence(name, p95, p95 / 100).to_json(),
                        "champion": evidence("champ", champion_p95, 1.0).to_json(), "champion_release": "champ-1"}
                 for name, p95, champion_p95 in (("a", 120.0, 200.0), ("b", 260.0, 400.0))}
    records = SweepRecords("sweep-x", opened={"speed": SIDE_BY_SIDE, "candidates": [{"name": "a"}, {"name": "b"}]},
                           evaluated=evaluated)

    judged = records.evidence()
    assert records.speed_scale().basis == SIDE_BY_SIDE and records.speed_scale().reference_ms == 150.0
    assert records.champion().metrics["p50_ms"] == 150.0
    judged.clear()
    assert [e.name for e in records.evidence()] == ["a", "b"]
    assert len(passes) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        records.evaluated = {}


@pytest.mark.parametrize(("windows", "problem"), [
    ({"a": GateWindow("champ-1", 100.0)}, "no gate window for b"),
    ({"a": GateWindow("champ-1", 100.0), "b": GateWindow("champ-1", 0.0)}, "is not positive"),
])
def test_bad_windows_are_refused_with_the_fix(windows, problem):
    with pytest.raises(BadInput, match=problem) as raised:
        on_one_scale([evidence("a", 100.0, 5.0), evidence("b", 200.0, 9.0)], windows)
    assert raised.value.fix


def _record(ledger, sweep, name: str, candidate_evidence: CandidateEvidence, champion_p50: float | None) -> None:
    candidate = sweep.candidate(name)
    champion = (CandidateEvidence("champion champ-1", "sha-champ", {"accuracy": 0.7, "p50_ms": champion_p50})
                if champion_p50 is not None else None)
    ledger.append(release_id=sweep.sweep_id, model=sweep.base.name, stage=events.SWEEP, event=events.EVALUATED,
                  payload={"candidate": name, "release_id": candidate.release_id,
                           "config_sha256": candidate.config_sha256,
                           "evidence": CandidateEvidence(name, candidate.config_sha256, candidate_evidence.metrics,
                                                         candidate_evidence.intervals).to_json(),
                           "champion": champion.to_json() if champion else None,
                           "champion_release": "champ-1" if champion else None}, actor="alice")


@pytest.mark.parametrize("opened_side_by_side", [True, False])
def test_the_ledger_judges_a_sweep_by_the_basis_it_opened_with(tmp_path, tiny_release, opened_side_by_side):
    """A new sweep opens side by side and its pick (cheapest per decision first) follows the candidates' ratios; one
    whose opening predates that (no `speed` in its record) is still judged as measured, so its recorded pick and
    `explain` keep agreeing."""
    from shiplift.tasks.sweeps.config import load_sweep

    base = tiny_release.write_tiny_config(tmp_path / "configs", tmp_path / "state")
    sweep = load_sweep(write_sweep(tmp_path / "sweeps", base, n_tasks=12, constraints=[]))
    ledger = Ledger.for_sqlite(tmp_path / "ledger.db")
    if opened_side_by_side:
        open_sweep(ledger, sweep, actor="alice")
    else:
        legacy = {key: value for key, value in opening(sweep).items() if key != "speed"}
        ledger.append(release_id=sweep.sweep_id, model=sweep.base.name, stage=events.SWEEP, event=events.OPENED,
                      payload=legacy, actor="alice")
    _record(ledger, sweep, "Q8_0", evidence("Q8_0", 1600.0, 20.0), champion_p50=2000.0)  # gated while loaded
    _record(ledger, sweep, "F16", evidence("F16", 1000.0, 12.5), champion_p50=1000.0)
    summary = record_pick(ledger, sweep.sweep_id, actor="alice", progress=quiet)

    records = SweepRecords.load(ledger, sweep.sweep_id)
    assert summary["picked"] == ("Q8_0" if opened_side_by_side else "F16")
    assert records.speed_scale().basis == (SIDE_BY_SIDE if opened_side_by_side else AS_MEASURED)
    assert summary["speed"] == records.speed_scale().to_json()
    assert explanation(records)["agrees"]
    raw = {e.name: e.metrics["p95_ms"] for e in records.measured_evidence()}
    assert raw == {"Q8_0": 1600.0, "F16": 1000.0}  # the ledger keeps what was measured

    written = write_report(records, tmp_path / "report")
    report = json.loads(Path(written["sweep_report_json"]).read_text())
    page = Path(written["report_html"]).read_text()
    assert report["speed"]["basis"] == records.speed_scale().basis
    assert {c["name"]: c["metrics"]["p95_ms"] for c in report["measured"]} == raw
    judged = {c["name"]: c["metrics"]["p95_ms"] for c in report["candidates"]}
    if opened_side_by_side:  # reference 1,500 ms: Q8_0's load 4/3, F16's 2/3
        assert judged == pytest.approx({"Q8_0": 1200.0, "F16": 1500.0})
        assert "Speeds side by side" in page and "1600 → 1200" in page and "side by side" in page
    else:
        assert judged == raw and "the sweep opened before speeds were compared side by side" in page
    ledger.close()
