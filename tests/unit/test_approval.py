"""Approval before production on the CLI: a passed candidate waits, an allowed approver approves or rejects it, and
every refusal (four eyes, unknown approver, not waiting, timed out, stale evidence) changes nothing.

Real local releases of the tiny model (tests/tiny_release.py); the deadline is moved by patching the approval
module's clock, never by sleeping.
"""

from __future__ import annotations

import contextlib
import json
from datetime import timedelta

import pytest

from shiplift.tasks.backends.registry import open_ledger
from shiplift.tasks.cli.main import main
from shiplift.tasks.config import load_release_config
from shiplift.tasks.console import EXIT_AWAITING
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.ledger.events import APPROVAL, APPROVED, AWAITING_APPROVAL, REJECTED, TIMED_OUT
from shiplift.tasks.ledger.views import serving_status
from shiplift.tasks.pipeline import approval
from shiplift.tasks.pipeline.release import run_release

APPROVAL_SETTINGS = {"required": True, "approvers": ["alice", "bob"], "four_eyes": True, "timeout_s": 3600}


@pytest.fixture(scope="module")
def story(tmp_path_factory, tiny_release):
    """Configs of one model: r1–r3 require an approval, `plain` does not; all opened by alice."""
    root = tmp_path_factory.mktemp("approval")
    state = root / "state"

    def config(label: str, **changes):
        return tiny_release.write_tiny_config(root / label, state, description=label, **changes)

    return {"state": state, "r1": config("r1", promotion__approval=APPROVAL_SETTINGS),
            "r2": config("r2", promotion__approval=APPROVAL_SETTINGS),
            "r3": config("r3", promotion__approval=APPROVAL_SETTINGS), "plain": config("plain")}


def cli(args: list[str], capsys, actor: str, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.setenv("SHIPLIFT_ACTOR", actor)
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@contextlib.contextmanager
def ledger_of(state):
    ledger = open_ledger(state_dir=state, read_only=True)
    try:
        yield ledger
    finally:
        ledger.close()


def ledger_size(state) -> int:
    with ledger_of(state) as ledger:
        return len(ledger.history())


def served(state, model: str = "tiny-decision") -> str | None:
    with ledger_of(state) as ledger:
        rows = serving_status(ledger, model)
    return (rows[0]["serving"] or {}).get("release_id") if rows else None


def test_the_config_needs_approvers_for_a_required_approval(tmp_path, tiny_release):
    bad = tiny_release.write_tiny_config(tmp_path, tmp_path / "state", promotion__approval={"required": True})
    with pytest.raises(ConfigError, match="approvers"):
        load_release_config(bad)
    idle = tiny_release.write_tiny_config(tmp_path / "b", tmp_path / "state",
                                          promotion__approval={"approvers": ["bob"]})
    with pytest.raises(ConfigError, match="required is false"):
        load_release_config(idle)


def test_a_config_without_approval_hashes_as_before_and_an_approval_changes_the_release(tmp_path, tiny_release):
    def release_hash(folder: str, **changes) -> str:
        return load_release_config(tiny_release.write_tiny_config(tmp_path, tmp_path / "state", name=folder,
                                                                  **changes)).config_hash()

    omitted = release_hash("tiny")
    assert release_hash("tiny", promotion={"approval": {"required": False}}) == omitted
    assert release_hash("tiny", promotion__approval=APPROVAL_SETTINGS) != omitted


def test_a_passed_release_waits_then_a_rejection_ends_it_and_nothing_serves(story, capsys, monkeypatch):
    state = story["state"]
    code, out, err = cli(["release", str(story["r1"]), "--json"], capsys, "alice", monkeypatch)
    summary = json.loads(out)
    assert code == EXIT_AWAITING and summary["status"] == AWAITING_APPROVAL and summary["decision"] == "pass"
    assert f"shiplift approve {summary['release_id']} --reason TEXT" in err
    assert summary["stages"]["promote"] == "pending" and summary["stages"]["teardown_candidate"] == "succeeded"
    request = summary["awaiting_approval"]
    assert request["approvers"] == ["alice", "bob"] and request["opened_by"] == "alice"
    assert request["gate"]["report_sha256"] and request["candidate_kept"] is False
    assert served(state) is None

    # a rerun keeps waiting and asks only once
    again = run_release(story["r1"], actor="alice", progress=lambda m: None)
    assert again["status"] == AWAITING_APPROVAL and again["awaiting_approval"]["seq"] == request["seq"]

    code, out, _ = cli(["status", "--state-dir", str(state)], capsys, "carol", monkeypatch)
    assert code == 0 and f"{summary['release_id']} awaits approval by one of alice, bob" in out

    before = ledger_size(state)
    for actor, needle in (("alice", "four eyes"), ("mallory", "not an approver")):
        code, _, err = cli(["approve", summary["release_id"], "--reason", "looks fine", "--state-dir", str(state)],
                           capsys, actor, monkeypatch)
        assert code == 1 and needle in err, err
    assert ledger_size(state) == before  # refusals change nothing

    code, out, _ = cli(["reject", summary["release_id"], "--reason", "ECE too high for us", "--state-dir", str(state),
                        "--json"], capsys, "bob", monkeypatch)
    result = json.loads(out)
    assert code == 0 and result["decision"] == REJECTED and result["by"] == "bob"
    assert result["summary"]["status"] == "rejected" and served(state) is None

    code, _, err = cli(["approve", summary["release_id"], "--reason", "changed my mind", "--state-dir", str(state)],
                       capsys, "bob", monkeypatch)
    assert code == 1 and "already rejected" in err


def test_an_approval_promotes_and_is_in_the_verified_chain(story, capsys, monkeypatch):
    state = story["state"]
    summary = run_release(story["r2"], actor="alice", progress=lambda m: None)
    assert summary["status"] == AWAITING_APPROVAL
    code, out, _ = cli(["approve", summary["release_id"], "--reason", "gate report read", "--state-dir", str(state)],
                       capsys, "bob", monkeypatch)
    assert code == 0 and "approved by bob" in out
    assert served(state) == summary["release_id"]

    code, out, _ = cli(["ledger", "show", summary["release_id"], "--state-dir", str(state), "--json"], capsys, "bob",
                       monkeypatch)
    detail = json.loads(out)
    events = [row["event"] for row in detail["approval"]]
    assert events == [AWAITING_APPROVAL, APPROVED] and detail["approval"][1]["by"] == "bob"
    assert detail["approval"][1]["report_sha256"] == detail["approval"][0]["report_sha256"]
    code, out, _ = cli(["ledger", "verify", "--state-dir", str(state), "--json"], capsys, "bob", monkeypatch)
    assert code == 0 and json.loads(out)["ok"] is True


def test_stale_and_timed_out_approvals_are_refused_and_a_timeout_ends_the_release_rejected(story, capsys, monkeypatch):
    state = story["state"]
    champion = served(state)
    assert champion is not None  # the approved release above
    waiting = run_release(story["r3"], actor="alice", progress=lambda m: None)
    assert waiting["status"] == AWAITING_APPROVAL and waiting["awaiting_approval"]["champion_release"] == champion
    plain = run_release(story["plain"], actor="alice", progress=lambda m: None)
    assert plain["status"] == "promoted"  # the champion changed while r3 waited

    before = ledger_size(state)
    code, _, err = cli(["approve", waiting["release_id"], "--reason", "ok", "--state-dir", str(state)], capsys, "bob",
                       monkeypatch)
    assert code == 1 and "stale evidence" in err

    real_now = approval._now
    monkeypatch.setattr(approval, "_now", lambda: real_now() + timedelta(seconds=APPROVAL_SETTINGS["timeout_s"] + 1))
    code, _, err = cli(["approve", waiting["release_id"], "--reason", "ok", "--state-dir", str(state)], capsys, "bob",
                       monkeypatch)
    assert code == 1 and "timed out" in err
    assert ledger_size(state) == before

    ended = run_release(story["r3"], actor="alice", progress=lambda m: None)
    assert ended["status"] == "rejected" and ended["awaiting_approval"] is None
    assert served(state) == plain["release_id"]
    with ledger_of(state) as ledger:
        records = ledger.release(waiting["release_id"])
    assert [r.event for r in records if r.stage == APPROVAL] == [AWAITING_APPROVAL, TIMED_OUT]
    assert [r.payload.get("reason", "") for r in records if (r.stage, r.event) == ("release", "rejected")] == [
        f"not approved: {records[[r.event for r in records].index(TIMED_OUT)].payload['reason']}"]


def test_an_answer_is_judged_at_the_time_it_was_given_and_one_dated_outside_the_wait_is_refused(tmp_path, tiny_release,
                                                                                                 monkeypatch):
    """An orchestrator's answer (Airflow's responded_at) given before the deadline is honoured although it reaches the
    ledger after it; one dated before the request or in the future is not this request's, and changes nothing."""
    from datetime import datetime

    from shiplift.tasks.pipeline.approval_steps import record_decision_orchestrated

    state = tmp_path / "state"
    config = tiny_release.write_tiny_config(tmp_path / "late", state, description="late",
                                            promotion__approval=APPROVAL_SETTINGS)
    waiting = run_release(config, actor="alice", progress=lambda m: None)
    assert waiting["status"] == AWAITING_APPROVAL
    with ledger_of(state) as ledger:
        request = next(r for r in ledger.release(waiting["release_id"]) if r.event == AWAITING_APPROVAL)
    asked = datetime.fromisoformat(request.recorded_at.replace("Z", "+00:00"))
    answer = {"approve": True, "actor": "bob", "reason": "checked the report", "state_dir": state,
              "progress": lambda m: None}
    before = ledger_size(state)
    for dated, why in ((asked - timedelta(minutes=1), "outside the wait"),
                       (asked + timedelta(days=1), "outside the wait"),
                       (asked.replace(tzinfo=None), "no time zone")):
        with pytest.raises(approval.Conflict, match=why):
            record_decision_orchestrated(waiting["release_id"], decided_at=dated.isoformat(), **answer)
    assert ledger_size(state) == before

    real_now = approval._now
    monkeypatch.setattr(approval, "_now", lambda: real_now() + timedelta(seconds=APPROVAL_SETTINGS["timeout_s"] + 1))
    with pytest.raises(approval.Conflict, match="timed out"):  # no date: judged when it is recorded, too late
        record_decision_orchestrated(waiting["release_id"], **answer)
    in_time = asked + timedelta(seconds=APPROVAL_SETTINGS["timeout_s"] - 1)
    decided = record_decision_orchestrated(waiting["release_id"], decided_at=in_time.isoformat(), **answer)
    assert decided["decision"] == APPROVED
    with ledger_of(state) as ledger:
        record = next(r for r in ledger.release(waiting["release_id"]) if r.event == APPROVED)
    assert record.payload["decided_at"] == in_time.isoformat() and record.payload["by"] == "bob"


def test_an_orchestrated_run_refuses_a_config_that_needs_an_approval(story):
    from shiplift.tasks.pipeline.release import begin_orchestrated

    with pytest.raises(ConfigError, match="cannot wait for"):
        begin_orchestrated(story["r1"], holder="airflow/run-1", allowed_timeouts={})


def test_the_cli_runs_each_step_the_policy_table_gives_it_under_that_step_s_policy(tmp_path, tiny_release, capsys,
                                                                                   monkeypatch):
    """Table-driven, on real releases through `shiplift`: a first release, a second that waits for an approval and is
    approved, then a rollback to the first. Every step the table says the CLI runs goes through `table.attempts`
    (retries, backoff) with that step's timeout for the config; the person's wait is the table's (the request's
    deadline); and while the release waits, the model's lease is free, as the table says."""
    from shiplift.tasks.pipeline import table

    state = tmp_path / "state"
    first = tiny_release.write_tiny_config(tmp_path / "first", state, description="first")
    second = tiny_release.write_tiny_config(tmp_path / "second", state, description="second",
                                            promotion__approval=APPROVAL_SETTINGS)
    config, attempts, seen = load_release_config(second), table.attempts, []

    def observed(name, run, *, timeout_s, say=lambda message: None):
        seen.append((name, timeout_s))
        return attempts(name, run, timeout_s=timeout_s, say=say)

    monkeypatch.setattr(table, "attempts", observed)
    assert cli(["release", str(first)], capsys, "alice", monkeypatch)[0] == 0
    first_id = run_release(first, progress=lambda message: None)["release_id"]  # already promoted: its id
    seen.clear()
    assert cli(["release", str(second)], capsys, "alice", monkeypatch)[0] == EXIT_AWAITING
    with ledger_of(state) as ledger:
        request = next(r for r in ledger.history() if (r.stage, r.event) == (APPROVAL, AWAITING_APPROVAL))
    # free while a person decides: another run takes it
    with contextlib.closing(open_ledger(state_dir=state)) as ledger:
        ledger.acquire_lease("tiny-decision", "someone-else", "tiny-decision-000000000000", 60)
        ledger.release_lease("tiny-decision", "someone-else")
    where = ["--state-dir", str(state)]
    assert cli(["approve", request.release_id, "--reason", "gate report read", *where], capsys, "bob",
               monkeypatch)[0] == 0
    assert cli(["rollback", "tiny-decision", "--to", first_id, "--reason", "drill", *where], capsys, "bob",
               monkeypatch)[0] == 0
    cli_steps = {name for name, step in table.STEPS.items() if "cli" in step.runs_in and not step.person}
    assert {name for name, _ in seen} == cli_steps - {table.FLEET_MOVE.name}  # tests/unit/test_fleet.py runs that one
    for name, timeout_s in seen:
        assert timeout_s == table.timeout_for(name, config), name
    assert request.payload["timeout_s"] == table.timeout_for("approval", config) and "cli" in table.APPROVAL.runs_in
