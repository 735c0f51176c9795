"""One evaluation per gate, end to end on the local backend (issue 50, item 3): the second release's gate reuses the
per-task results the first release's gate recorded of the model that now serves as champion, and the ledger says so;
`--fresh-champion` scores the champion on every task again."""

from __future__ import annotations

from pathlib import Path

from shiplift.tasks.ledger.records import stage_payload
from shiplift.tasks.ledger.stage_results import ValidateResult
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import run_release
from shiplift.validation.champion_reuse import CHAMPION_LATENCY

QUIET = lambda message: None  # noqa: E731


def gate_record(ledger: Ledger, release_id: str) -> ValidateResult:
    record, = [r for r in ledger.release(release_id) if (r.stage, r.event) == ("validate", "succeeded")]
    return stage_payload(record, ValidateResult)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_next_gate_reuses_the_champions_recorded_results_and_fresh_champion_scores_it_again(release_config,
                                                                                                   tmp_path):
    config = release_config(validation__champion__latency_sample=8)
    first = run_release(config, progress=QUIET)
    assert first["status"] == "promoted"
    ledger = Ledger.for_sqlite(tmp_path / "state" / "ledger.db")
    recorded = gate_record(ledger, first["release_id"])
    assert set(recorded.measured) == {"predictions.jsonl"} and recorded.champion_evidence is None  # no champion yet

    said: list[str] = []
    second = run_release(config, overrides=("calibration.fit_temperature=true",), progress=said.append)
    gate = gate_record(ledger, second["release_id"])
    assert gate.champion_release == first["release_id"]
    assert gate.champion_evidence == {"reused": True, "from_release": first["release_id"],
                                      "file": "predictions.jsonl", "n": 32, "latency_sample": 8}
    assert set(gate.measured) == {"predictions.jsonl"}, "reused rows are not recorded again as measured"
    folder = Path(second["report"]).parent
    assert lines(folder / CHAMPION_LATENCY) == 8, "the champion answered only its latency sample"
    assert lines(folder / "champion-predictions.jsonl") == 32
    assert any("reusing its per-task results from release" in line for line in said)
    report_html = Path(second["report"]).read_text()
    assert f"reused from release {first['release_id']}" in report_html
    assert second["status"] == "promoted"

    third = run_release(config, overrides=("validation.seed=1",), fresh_champion=True, progress=said.append)
    gate = gate_record(ledger, third["release_id"])
    assert gate.champion_release == second["release_id"]
    assert gate.champion_evidence == {"reused": False, "why": "--fresh-champion"}
    assert set(gate.measured) == {"predictions.jsonl", "champion-predictions.jsonl"}
    folder = Path(third["report"]).parent
    assert lines(folder / "champion-predictions.jsonl") == 32 and not (folder / CHAMPION_LATENCY).exists()
