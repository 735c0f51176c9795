"""One evaluation per gate (issue 50, item 3): a gate reuses the champion's per-task results an earlier gate recorded
under the same identity, scores only the candidate on the rest, and still times the champion live on an alternated
sample; a changed identity, a missing or lost row, or a fresh request scores the champion on every task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from shiplift.validation.champion_reuse import (
    CHAMPION_LATENCY,
    ChampionOffer,
    Identity,
    Recorded,
    latency_turns,
)
from shiplift.validation.decisions.evaluate import evaluate_decisions
from shiplift.validation.evaluate import RunSettings, Target
from shiplift.validation.runner import read_predictions
from shiplift.validation.thresholds import ChampionRule
from tests.unit.test_latency_ratio import Recorder, runs, semif_answer, tasks

SETTINGS = RunSettings(concurrency=2, timeout_s=10, deadline_s=60, n_bootstrap=100)
RULE = ChampionRule(n_bootstrap=100, min_samples=5)
CHAMPION = Identity(serving_id="c" * 64, determinism={"threads": 4, "n_batch": 512}, readout="semif")


def gate(out: Path, recorder: Recorder, offer: ChampionOffer | None, n: int = 24) -> dict:
    """A gate of a candidate ("new") against a champion ("old") on `n` tasks, with the champion's `offer`."""
    return evaluate_decisions(
        Target(recorder.invoker("new", semif_answer), "new"), [tasks(n)], out, thresholds=None, champion_rule=RULE,
        champion=Target(recorder.invoker("old", semif_answer), "old", offer), settings=SETTINGS)


def recorded_from(out: Path, identity: Identity, *, release_id: str = "rel-1", sha256: str = "0" * 64) -> Recorded:
    """The champion's file of the gate written to `out`, as a validate record names it (dataset `unit`)."""
    keys = identity.measured([{"name": "unit", "sha256": sha256}])["keys"]
    return Recorded(release_id, "champion-predictions.jsonl", keys,
                    lambda: [p.to_dict() for p in read_predictions(out / "champion-predictions.jsonl")])


def champion_requests(recorder: Recorder) -> int:
    return sum(1 for label, _ in recorder.arrivals if label == "old")


def champion_checks(report: dict) -> list[dict]:
    return [c for c in report["checks"] if c["name"].startswith("champion_accuracy")]


@pytest.fixture
def first(tmp_path) -> Path:
    """A first gate that scored the champion on all 24 tasks (nothing recorded yet)."""
    recorder = Recorder()
    report = gate(tmp_path / "first", recorder, ChampionOffer(CHAMPION, [], latency_sample=8))
    assert champion_requests(recorder) == 24
    assert report["champion"]["evidence"]["reused"] is False
    assert "no earlier gate recorded" in report["champion"]["evidence"]["why"]
    assert not (tmp_path / "first" / CHAMPION_LATENCY).exists()
    return tmp_path / "first"


def test_a_second_gate_reuses_the_recorded_results_and_times_the_champion_on_an_alternated_sample(first, tmp_path):
    recorder = Recorder()
    offer = ChampionOffer(CHAMPION, [recorded_from(first, CHAMPION)], latency_sample=8)
    report = gate(tmp_path / "second", recorder, offer)
    assert champion_requests(recorder) == 8, "only the latency sample reaches the champion"
    assert sum(1 for label, _ in recorder.arrivals if label == "new") == 24
    # two live turns of 4 (0 and 3 of six), answered by both sides, alternated (A B, then B A); the candidate alone
    # answers the others
    assert runs(recorder.arrivals) == [("new", 4), ("old", 4), ("new", 8), ("old", 4), ("new", 12)]
    assert report["champion"]["evidence"] == {"reused": True, "from_release": "rel-1",
                                              "file": "champion-predictions.jsonl", "n": 24, "latency_sample": 8}
    assert report["champion"]["n"] == 24 and report["champion"]["p95_ratio"]["n"] == 7  # 8 paired, less the cold one
    assert report["champion"]["metrics"]["latency_ms"]["n_successful"] == 8, "its latency is this window's sample"
    assert len((tmp_path / "second" / CHAMPION_LATENCY).read_text().splitlines()) == 8
    reused = (tmp_path / "second" / "champion-predictions.jsonl").read_text()
    assert reused == (first / "champion-predictions.jsonl").read_text(), "the recorded rows are the evidence"


def test_the_decision_is_the_same_with_and_without_reuse_on_the_same_evidence(first, tmp_path):
    fresh = gate(tmp_path / "fresh", Recorder(), ChampionOffer(CHAMPION, [], latency_sample=8))
    reused = gate(tmp_path / "reused", Recorder(),
                  ChampionOffer(CHAMPION, [recorded_from(first, CHAMPION)], latency_sample=8))
    assert reused["champion"]["evidence"]["reused"] and not fresh["champion"]["evidence"]["reused"]
    assert reused["decision"] == fresh["decision"]
    assert champion_checks(reused) == champion_checks(fresh)
    assert reused["champion"]["accuracy"] == fresh["champion"]["accuracy"]


@pytest.mark.parametrize("changed", [
    {"serving_id": "d" * 64},  # another image, artifact or server setting
    {"determinism": {"threads": 8, "n_batch": 512}},
    {"readout": "chat"},
])
def test_a_changed_identity_scores_the_champion_on_every_task(first, tmp_path, changed):
    recorded_as = Identity(**{**CHAMPION.__dict__, **changed})
    recorder = Recorder()
    report = gate(tmp_path / "second", recorder, ChampionOffer(CHAMPION, [recorded_from(first, recorded_as)], 8))
    assert champion_requests(recorder) == 24
    assert report["champion"]["evidence"]["reused"] is False
    assert not (tmp_path / "second" / CHAMPION_LATENCY).exists()


def test_another_dataset_file_scores_the_champion_on_every_task(first, tmp_path):
    recorder = Recorder()
    report = gate(tmp_path / "second", recorder,
                  ChampionOffer(CHAMPION, [recorded_from(first, CHAMPION, sha256="1" * 64)], 8))
    assert champion_requests(recorder) == 24 and report["champion"]["evidence"]["reused"] is False


def test_a_gate_needing_tasks_the_record_lacks_lost_or_failed_scores_the_champion_on_every_task(first, tmp_path):
    recorder = Recorder()
    report = gate(tmp_path / "more", recorder, ChampionOffer(CHAMPION, [recorded_from(first, CHAMPION)], 8), n=30)
    assert champion_requests(recorder) == 30
    assert report["champion"]["evidence"]["why"].startswith("6 tasks (e.g. t24 of unit) have no answered row")

    rows = (first / "champion-predictions.jsonl").read_text().splitlines()
    for name, unanswered in (("lost", {"lost": True, "error": "no answer"}), ("failed", {"error": "HTTP 500: boom"})):
        broken = json.loads(rows[3]) | unanswered | {"probabilities": None}
        (first / "champion-predictions.jsonl").write_text("\n".join([*rows[:3], json.dumps(broken), *rows[4:]]) + "\n")
        recorder = Recorder()
        report = gate(tmp_path / name, recorder, ChampionOffer(CHAMPION, [recorded_from(first, CHAMPION)], 8))
        assert champion_requests(recorder) == 24, name
        assert "1 tasks (e.g. t03 of unit)" in report["champion"]["evidence"]["why"]


def test_fresh_champion_scores_it_on_every_task_and_says_why(first, tmp_path):
    recorder = Recorder()
    offer = ChampionOffer(CHAMPION, [recorded_from(first, CHAMPION)], 8, fresh="--fresh-champion")
    report = gate(tmp_path / "second", recorder, offer)
    assert champion_requests(recorder) == 24
    assert report["champion"]["evidence"] == {"reused": False, "why": "--fresh-champion"}


def test_the_newest_record_that_holds_every_task_is_used(first, tmp_path):
    elsewhere = recorded_from(first, CHAMPION, release_id="rel-newer", sha256="1" * 64)  # another dataset's file
    report = gate(tmp_path / "second", Recorder(),
                  ChampionOffer(CHAMPION, [elsewhere, recorded_from(first, CHAMPION)], 8))
    assert report["champion"]["evidence"]["from_release"] == "rel-1"


def test_the_live_turns_are_spread_over_the_gate_and_hold_the_sample():
    assert latency_turns([4] * 6, 8) == {0, 3}
    assert latency_turns([4] * 6, 9) == {0, 2, 4}
    assert latency_turns([4, 4, 1], 100) == {0, 1, 2}
    assert latency_turns([4] * 28, 30) == {0, 3, 7, 10, 14, 17, 21, 24}


def test_the_reuse_key_names_every_identity_and_the_dataset():
    base = CHAMPION.key("0" * 64)
    assert CHAMPION.key("1" * 64) != base
    for changed in ({"serving_id": "d" * 64}, {"determinism": None}, {"readout": "chat"}):
        assert Identity(**{**CHAMPION.__dict__, **changed}).key("0" * 64) != base


def test_the_latency_sample_must_let_the_ratio_be_judged_and_defaults_hash_as_before():
    with pytest.raises(ValidationError, match="latency_sample 10 is below min_samples 30"):
        ChampionRule(max_p95_ratio=2.0, latency_sample=10)
    assert ChampionRule(latency_sample=10).latency_sample == 10  # no ratio judged: any sample
    assert "reuse" not in ChampionRule().model_dump() and "latency_sample" not in ChampionRule().model_dump()
    assert ChampionRule(reuse="fresh", latency_sample=40).model_dump()["reuse"] == "fresh"
