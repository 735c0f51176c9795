"""A ledger written before stage results were typed still opens and resumes.

`tests/data/legacy-ledger-records.json` holds every record two tiny releases appended with the code as it was before
`tasks.pipeline.results` (one promoted, one rejected by its gate; paths under the run's root are `{ROOT}`). They are
appended, in order, to a fresh ledger; then every stage of both releases reads back as its typed result, a resumed run
returns the recorded results without running a stage again, and the typed result records the very payload the old code
wrote (so a stage re-recorded after the upgrade writes what it always wrote).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shiplift.tasks.ledger.release_state import RECORD_ONLY_KEYS, ReleaseState, release_summary
from shiplift.tasks.ledger.stage_results import RESULTS, BuildResult, PromoteResult, ValidateResult
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import ensure_stage, reopen_release
from shiplift.tasks.pipeline.table import STAGE_NAMES, TEARDOWN

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "legacy-ledger-records.json"


@pytest.fixture
def legacy(tmp_path):
    """The legacy records appended to a fresh SQLite ledger under tmp_path; the release ids, promoted first."""
    text = FIXTURE.read_text(encoding="utf-8").replace("{ROOT}", str(tmp_path))
    records = json.loads(text)["records"]
    (tmp_path / "state").mkdir()
    ledger = Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    for record in sorted(records, key=lambda r: r["seq"]):
        ledger.append(release_id=record["release_id"], model=record["model"], stage=record["stage"],
                      event=record["event"], payload=record["payload"], actor=record["actor"])
    ids = list(dict.fromkeys(r["release_id"] for r in sorted(records, key=lambda r: r["seq"])))
    yield ledger, ids, records
    ledger.close()


def test_every_legacy_stage_result_reads_back_typed_and_records_the_same_payload(legacy, tmp_path):
    ledger, ids, records = legacy
    assert ids and len(ids) == 2
    for release_id in ids:
        ctx = reopen_release(release_id, state_dir=tmp_path / "state", progress=lambda message: None)
        for name in STAGE_NAMES:
            result = ctx.result(name)
            assert type(result) is RESULTS[name]
            written = next(r for r in reversed(records) if r["release_id"] == release_id and r["stage"] == name
                           and r["event"] != "started")
            payload = {k: v for k, v in written["payload"].items() if k not in RECORD_ONLY_KEYS}
            assert result.event == written["event"]
            assert result.record() == payload, name
    promoted, rejected = (reopen_release(rid, state_dir=tmp_path / "state", progress=lambda m: None) for rid in ids)
    build = promoted.result("build")
    assert isinstance(build, BuildResult) and build.memory.total_mb > 0
    assert build.model_extra["gguf_sha256"] == build.model_sha256
    assert isinstance(promoted.result("validate"), ValidateResult) and promoted.result("validate").decision == "pass"
    assert rejected.result("promote") == PromoteResult(event="skipped", reason="gate decision fail", decision="fail")


def test_a_resumed_legacy_release_runs_no_finished_stage_again(legacy, tmp_path):
    ledger, ids, _ = legacy
    for release_id in ids:
        before = len(ledger.release(release_id))
        ctx = reopen_release(release_id, state_dir=tmp_path / "state", progress=lambda message: None)
        for name in STAGE_NAMES:
            if name != TEARDOWN:
                assert ensure_stage(ctx, name) == ctx.result(name)
        assert len(ledger.release(release_id)) == before, "no stage ran again"
    summaries = [release_summary(ReleaseState(ledger, rid)) for rid in ids]
    assert [s["status"] for s in summaries] == ["promoted", "rejected"]
    assert summaries[0]["file_type"] == "Q8_0" and summaries[0]["decision"] == "pass"
