"""The audit: ledger chain verification and live endpoints against the ledger (tiny model, local backend)."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.errors import Conflict, IntegrityError, NotFound
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.audit import audit
from shiplift.tasks.pipeline.release import run_release
from tests.unit.conftest import Backend
from tests.unit.test_checkpoints import _rewrite

MODEL, PROD = "tiny-decision", "shiplift-tiny-decision-prod"


@pytest.fixture(scope="module")
def promoted(tmp_path_factory, tiny_release):
    """One promoted tiny release; its production endpoint serves for the module's tests."""
    root = tmp_path_factory.mktemp("audit")
    state_dir = root / "state"
    summary = run_release(tiny_release.write_tiny_config(root / "configs", state_dir), progress=lambda m: None)
    assert summary["status"] == "promoted"
    yield state_dir, summary["release_id"]
    hosting = ProcessSupervisor(state_dir)
    for endpoint in hosting.list_endpoints():
        hosting.delete_endpoint(endpoint["name"])


def copy_ledger(state_dir: Path, target: Path) -> Ledger:
    """A consistent copy of the (WAL-mode) ledger, so a test can change it without touching the original."""
    with sqlite3.connect(state_dir / "ledger.db") as source, sqlite3.connect(target) as copy:
        source.backup(copy)
    return Ledger(f"sqlite:///{target}")


def test_audit_reports_what_serves_when_it_matches_the_ledger(promoted):
    state_dir, release_id = promoted
    report = audit(state_dir)
    assert report["ok"] and report["n_records"] == len(Ledger.for_sqlite(state_dir / "ledger.db").history())
    row = report["models"][MODEL]
    assert row["release_id"] == release_id and row["endpoint"] == PROD and row["component"] == f"shiplift-{MODEL}"
    assert row["live"] == row["expected"] and row["live"]["release_id"] == release_id
    live = ProcessSupervisor(state_dir).describe_endpoint(PROD)["components"][f"shiplift-{MODEL}"]["spec"]["model_ref"]
    assert row["live"] == live


def test_an_edited_record_breaks_the_chain(promoted, tmp_path):
    state_dir, _ = promoted
    copy_ledger(state_dir, tmp_path / "ledger.db").close()
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        db.execute("UPDATE ledger_records SET actor = 'mallory' WHERE seq = 3")
    with pytest.raises(IntegrityError, match=r"ledger chain is broken.*seq 3: record_hash does not match"):
        audit(state_dir, ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}")


def test_a_ledger_rewritten_with_recomputed_hashes_fails_against_its_checkpoint(promoted, tmp_path):
    state_dir, _ = promoted
    copy = copy_ledger(state_dir, tmp_path / "ledger.db")
    _rewrite(Backend("sqlite", "", None, sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")), copy, 3,
             {"forged": True})
    assert copy.verify().ok, "the chain alone cannot tell"
    with pytest.raises(IntegrityError, match=r"record \d+ hashes to .*the chain was rewritten"):
        audit(state_dir, ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}")


def test_drift_names_each_field_and_endpoint_that_differs(promoted, tmp_path):
    state_dir, release_id = promoted
    ledger = copy_ledger(state_dir, tmp_path / "ledger.db")
    last = ledger.served_at(MODEL, "2100-01-01T00:00:00Z")
    claimed = {**last.payload["served"], "artifact_sha256": "f" * 64}
    ledger.append(release_id="tiny-decision-aaaaaaaaaaaa", model=MODEL, stage="promote", event="succeeded",
                  payload={**last.payload, "served": {**claimed, "release_id": "tiny-decision-aaaaaaaaaaaa"}},
                  actor="pytest")
    ledger.append(release_id="gone-model-bbbbbbbbbbbb", model="gone-model", stage="promote", event="succeeded",
                  payload={"endpoint": "shiplift-gone-model-prod", "component": "gone-model", "served": claimed},
                  actor="pytest")
    ledger.close()
    with pytest.raises(Conflict) as raised:
        audit(state_dir, ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    message = str(raised.value)
    assert f"serves release_id '{release_id}', the ledger" in message and "'tiny-decision-aaaaaaaaaaaa'" in message
    assert f"serves artifact_sha256 '{last.payload['served']['artifact_sha256']}'" in message and "f" * 64 in message
    assert "image_digest" not in message, "only the fields that differ are named"
    assert ("gone-model-bbbbbbbbbbbb serves on shiplift-gone-model-prod/gone-model, but the ledger holds no opened "
            "release of this model") in message
    assert audit(state_dir)["ok"], "the real ledger and endpoint still agree"


def test_a_stopped_router_is_drift(promoted, tmp_path):
    state_dir, release_id = promoted
    hosting = ProcessSupervisor(state_dir)
    os.kill(hosting.describe_endpoint(PROD)["router"]["pid"], signal.SIGTERM)
    try:
        deadline = time.monotonic() + 15
        while hosting.describe_endpoint(PROD)["router"]["alive"]:
            assert time.monotonic() < deadline, "the router did not stop"
            time.sleep(0.1)
        with pytest.raises(Conflict,
                           match=f"{release_id} serves on {PROD}/shiplift-{MODEL}, but {PROD}/shiplift-{MODEL} is "
                                 "OutOfService"):
            audit(state_dir)
    finally:
        hosting.ensure_endpoint(PROD)  # restarts the router for later tests
    assert audit(state_dir)["ok"]


def test_no_ledger_is_not_found(tmp_path):
    with pytest.raises(NotFound, match="no ledger at"):
        audit(tmp_path)
