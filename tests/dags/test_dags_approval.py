"""Approval in Airflow: the refresh and promote DAGs wait with `ApprovalOperator`, answered through Airflow's own API.

`dag.test()` (Airflow 3.3) parks the HITL task in `awaiting_input` and keeps the run alive until a response recorded
from outside flips it back to scheduled. In the same process as `dag.test()` (this file run as a script), a responder
thread drives the HITL REST API the UI uses (`PATCH /api/v2/dags/{dag}/dagRuns/{run}/taskInstances/approval/-1/
hitlDetails`, `airflow.api_fastapi.core_api.routes.public.hitl.update_hitl_detail`), on Airflow's own FastAPI app,
logged in as each user through the simple auth manager's `POST /auth/token`. Its handshake: poll the API for an
unanswered HITL detail of the DAG whose task is `awaiting_input`, with a deadline, then answer it. For the timeout, the
thread runs the scheduler's own `awaiting_input` sweep (`SchedulerJobRunner.check_awaiting_input_timeouts`, which
`dag.test()` does not run) once the task's response deadline has passed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
USERS = {"alice": "alice-pw", "bob": "bob-pw", "dag_test": "dag-test-pw", "mallory": "mallory-pw"}
APPROVERS = ["alice", "bob", "dag_test"]  # dag_test: the user dag.test() triggers its runs as (the opener)
DETAIL_WAIT_S = 240.0
_CLIENT = None


# ---------------------------------------------------------------- the runner (this file run as a script)

def _client():
    """Airflow's own API app (core API, with the simple auth manager's login), in this process."""
    global _CLIENT
    if _CLIENT is None:
        from airflow.api_fastapi.app import create_app
        from fastapi.testclient import TestClient

        _CLIENT = TestClient(create_app(apps="core"))
    return _CLIENT


def _login(client, user: str) -> dict[str, str]:
    response = client.post("/auth/token", json={"username": user, "password": USERS[user]})
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


def _awaiting_detail(client, headers: dict, dag_id: str, done: threading.Event, deadline: float) -> dict | None:
    """The DAG's unanswered HITL detail once its task waits in awaiting_input; None when the run ended first."""
    while time.monotonic() < deadline and not done.is_set():
        response = client.get(f"/api/v2/dags/{dag_id}/dagRuns/~/hitlDetails", headers=headers,
                              params={"response_received": False})
        response.raise_for_status()
        waiting = [d for d in response.json()["hitl_details"] if d["task_instance"]["state"] == "awaiting_input"]
        if waiting:
            return waiting[0]
        done.wait(0.25)
    return None


def _sweep_when_due(ti_id: str, done: threading.Event, deadline: float) -> bool:
    """Run the scheduler's awaiting_input timeout sweep once this task's response deadline has passed."""
    from uuid import UUID

    from airflow._shared.timezones import timezone
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    while time.monotonic() < deadline and not done.is_set():
        with create_session() as session:
            ti = session.get(TaskInstance, UUID(ti_id))
            due = ti.trigger_timeout is not None and ti.trigger_timeout < timezone.utcnow()
        if due:
            SchedulerJobRunner(job=Job()).check_awaiting_input_timeouts()
            return True
        done.wait(0.25)
    return False


def _lease_free(ledger_db: str, model: str) -> bool | str:
    """Whether another holder can take the model's promotion lease now (it is given back at once), else why not."""
    from shiplift.tasks.errors import LeaseHeld
    from shiplift.tasks.ledger.store import Ledger

    ledger = Ledger.for_sqlite(Path(ledger_db))
    try:
        ledger.acquire_lease(model, "probe", f"{model}-000000000000", 60)
        ledger.release_lease(model, "probe")
        return True
    except LeaseHeld as held:
        return str(held)
    finally:
        ledger.close()


def _respond(run: dict, done: threading.Event, report: dict) -> None:
    """Answer one run's approval as the spec says: `answers` in order (each with the status Airflow answered), or
    `sweep` (nobody answers: the timeout sweep)."""
    try:
        client = _client()
        headers = {user: _login(client, user) for user in USERS}
        detail = _awaiting_detail(client, headers["alice"], run["dag_id"], done, time.monotonic() + DETAIL_WAIT_S)
        if detail is None:
            report["error"] = "no HITL detail awaiting input appeared before the run ended or the deadline"
            return
        ti = detail["task_instance"]
        report["detail"] = {key: detail[key] for key in ("subject", "body", "options", "defaults", "params",
                                                         "assigned_users", "multiple")}
        report["detail"]["operator"] = ti["operator"]
        if run.get("lease_probe"):  # while a person decides the run holds no lease: another run could take it
            report["lease_free"] = _lease_free(**run["lease_probe"])
        url = f"/api/v2/dags/{ti['dag_id']}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}/-1/hitlDetails"
        report["answers"] = []
        for answer in run.get("answers", []):
            response = client.patch(url, headers=headers[answer["user"]], json={
                "chosen_options": [answer["option"]], "params_input": {"comment": answer["comment"]}})
            report["answers"].append({"user": answer["user"], "status": response.status_code, "body": response.json()})
        if run.get("sweep"):
            report["swept"] = _sweep_when_due(ti["id"], done, time.monotonic() + DETAIL_WAIT_S)
        after = client.get(url, headers=headers["alice"]).json()
        report["after"] = {key: after.get(key) for key in ("responded_by_user", "chosen_options", "params_input",
                                                           "response_received")}
    except Exception as exc:
        report["error"] = repr(exc)
    # nobody will answer: end the process rather than leave dag.test() waiting for ever
    if "error" in report and not done.is_set():
        print(f"RESPONDER ERROR {run['dag_id']}: {report['error']}", flush=True)
        os._exit(3)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    runner = importlib.util.spec_from_file_location("shiplift_run_dag", ROOT / "scripts" / "run_dag.py")
    run_dag = importlib.util.module_from_spec(runner)
    runner.loader.exec_module(run_dag)
    from airflow.dag_processing.dagbag import BundleDagBag

    folder = Path(spec["dags_folder"])
    bag = BundleDagBag(dag_folder=folder, bundle_path=folder)
    result = {"import_errors": {str(k): str(v) for k, v in bag.import_errors.items()}, "runs": []}
    for run in spec["runs"]:
        done, report = threading.Event(), {}
        responder = threading.Thread(target=_respond, args=(run, done, report), daemon=True)
        responder.start()
        outcome = run_dag.run_one(bag.get_dag(run["dag_id"]), run.get("conf"))
        done.set()
        responder.join(60)
        result["runs"].append({**outcome, "hitl": report})
    print("RESULT " + json.dumps(result, default=str), flush=True)


# ---------------------------------------------------------------- the test

@pytest.fixture
def approval_env(airflow_env, tmp_path) -> dict[str, str]:
    """The migrated Airflow home with four users of the simple auth manager and their passwords."""
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps(USERS))
    return {**airflow_env, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:user" for u in USERS),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False"}


@pytest.fixture
def run_with_answers(approval_env, tmp_path):
    """Run DAGs with dag.test() in a subprocess, each run's approval answered by the responder thread."""

    def run(folder: Path, runs: list[dict], timeout_s: float = 600) -> tuple[dict, str]:
        spec = tmp_path / f"approval-spec-{time.monotonic_ns()}.json"
        spec.write_text(json.dumps({"dags_folder": str(folder), "runs": runs}))
        done = subprocess.run([sys.executable, __file__, str(spec)], capture_output=True, text=True, timeout=timeout_s,
                              env={**approval_env, "AIRFLOW__CORE__DAGS_FOLDER": str(folder)}, cwd=ROOT)
        output = done.stdout + done.stderr
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, output[-6000:]
        result = json.loads(lines[-1].removeprefix("RESULT "))
        assert result["import_errors"] == {}
        for entry in result["runs"]:
            assert "error" not in entry["hitl"], (entry["dag_id"], entry["hitl"]["error"], output[-6000:])
        return result, output

    return run


def _approval_records(ledger, release_id: str) -> list:
    return [r for r in ledger.release(release_id) if r.stage == "approval"]


@pytest.mark.slow  # ~84 s: make test-slow; make test keeps the DAG's approval wiring and the CLI approval story
@pytest.mark.timeout(1200)  # four tiny releases and a promotion, each through dag.test(), on two shared cores
def test_refresh_and_promote_dags_wait_for_a_person_answering_through_airflows_hitl_api(
        tmp_path, dags_for_configs, run_with_answers, tiny_release):
    """Through Airflow's HITL API: an unassigned user is refused by Airflow (403) and alice approves (promoted, the
    ledger names her and her comment); the opener's own approval is refused by four eyes (the decision task fails with
    the Conflict, nothing recorded) and the promote DAG then asks again and bob approves; bob rejects one (rejected,
    the champion serving on); one nobody answers times out through the scheduler's sweep (rejected, timed_out)."""
    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
    from shiplift.tasks.config import load_release_config
    from shiplift.tasks.errors import Conflict
    from shiplift.tasks.ledger.release_state import ReleaseState
    from shiplift.tasks.ledger.store import Ledger
    from shiplift.tasks.pipeline.approval_steps import record_decision_orchestrated
    from shiplift.tasks.pipeline.release import release_id_for

    state_dir = tmp_path / "state"
    config = tiny_release.write_tiny_config(tmp_path / "configs", tmp_path / "unused-state", name="tiny-approval",
                                            promotion__approval={"required": True, "approvers": APPROVERS,
                                                                 "timeout_s": 3600, "four_eyes": True})
    folder = dags_for_configs(config)
    (folder / "promote_release.py").write_text((DAGS / "promote_release.py").read_text())
    overrides = {key: [f"backend.state_dir={state_dir}", *extra] for key, extra in {
        "approved": [], "four_eyes": ["validation.n_bootstrap=201"], "rejected": ["validation.n_bootstrap=202"],
        "timed_out": ["validation.n_bootstrap=203", "promotion.approval.timeout_s=6"]}.items()}
    ids = {key: release_id_for(load_release_config(config, overrides=value)) for key, value in overrides.items()}
    assert len(set(ids.values())) == 4
    dag_id = "refresh_tiny_approval"
    approve_note, reject_note = "gate report read; ECE within budget", "latency too close to the bound"
    try:
        first, output = run_with_answers(folder, [
            {"dag_id": dag_id, "conf": {"overrides": overrides["approved"]},
             "lease_probe": {"ledger_db": str(state_dir / "ledger.db"), "model": "tiny-approval"}, "answers": [
                {"user": "mallory", "option": "Approve", "comment": "let me in"},
                {"user": "alice", "option": "Approve", "comment": approve_note}]},
            {"dag_id": dag_id, "conf": {"overrides": overrides["four_eyes"]}, "answers": [
                {"user": "dag_test", "option": "Approve", "comment": "I opened it, I approve it"}]},
        ])
        approved, four_eyes = first["runs"]
        ledger = Ledger.for_sqlite(state_dir / "ledger.db")

        # What Airflow shows and whom it asks: the gate summary, the approvers assigned, Reject by default.
        detail = approved["hitl"]["detail"]
        assert detail["operator"] == "ShipliftApproval" and detail["options"] == ["Approve", "Reject"]
        assert detail["defaults"] == ["Reject"] and detail["multiple"] is False and "comment" in detail["params"]
        assert ids["approved"] in detail["subject"]
        for shown in ("gate decision | **pass**", "report.html", "opened by | dag_test (four eyes", "deadline |",
                      "approvers | alice, bob, dag_test", "torn down"):
            assert shown in detail["body"], shown
        assert [user["id"] for user in detail["assigned_users"]] == APPROVERS
        assert approved["hitl"]["lease_free"] is True, "the policy table: approval_request releases the lease"

        # mallory is not assigned: Airflow refuses her and the task keeps waiting; alice's approval is recorded.
        (refused, accepted) = approved["hitl"]["answers"]
        assert refused["status"] == 403 and "not a respondent" in json.dumps(refused["body"])
        assert accepted["status"] == 200 and accepted["body"]["responded_by"] == {"id": "alice", "name": "alice"}
        assert approved["state"] == "success", output[-6000:]
        assert approved["tasks"] == {name: "success" for name in approved["tasks"]}
        assert approved["xcom"]["approval_decision"] == {"release_id": ids["approved"], "decision": "approved",
                                                         "by": "alice", "reason": approve_note}
        assert approved["xcom"]["end"]["status"] == "promoted"
        records = ledger.release(ids["approved"])
        request, decision = _approval_records(ledger, ids["approved"])
        assert (request.event, decision.event) == ("awaiting_approval", "approved")
        assert decision.payload["by"] == "alice" and decision.payload["reason"] == approve_note
        assert decision.actor == "alice" and decision.payload["requested_seq"] == request.seq
        # Airflow's responded_at: the deadline's moment
        answered = datetime.fromisoformat(decision.payload["decided_at"])
        assert answered == datetime.fromisoformat(accepted["body"]["responded_at"].replace("Z", "+00:00"))
        assert answered <= datetime.fromisoformat(decision.recorded_at.replace("Z", "+00:00"))
        assert request.payload["opened_by"] == "dag_test" == records[0].actor
        torn_down = [r.seq for r in records if (r.stage, r.event) == ("teardown_candidate", "succeeded")]
        assert torn_down[0] < decision.seq, "the candidate was torn down while the release waited"
        assert ledger.served_at("tiny-approval", "2100-01-01T00:00:00Z").release_id == ids["approved"]

        # The opener approving their own release: Airflow takes the answer (dag_test is assigned), the ledger refuses
        # it under four eyes; the decision task fails with the Conflict and nothing is recorded.
        assert four_eyes["hitl"]["answers"][0]["status"] == 200
        assert four_eyes["state"] == "failed" and four_eyes["tasks"]["approval_decision"] == "failed"
        assert four_eyes["tasks"]["approval"] == "success" and four_eyes["tasks"]["promote"] == "upstream_failed"
        assert f"'dag_test' opened release {ids['four_eyes']}; four eyes" in output
        assert [r.event for r in _approval_records(ledger, ids["four_eyes"])] == ["awaiting_approval"]
        assert ReleaseState.load(ledger, ids["four_eyes"]).status == "failed"
        assert ledger.served_at("tiny-approval", "2100-01-01T00:00:00Z").release_id == ids["approved"]

        # Someone who is not an approver, where an auth manager does not assign (ids are not names): refused by the
        # ledger, nothing recorded.
        with pytest.raises(Conflict, match="'mallory' is not an approver"):
            record_decision_orchestrated(ids["four_eyes"], approve=True, actor="mallory", reason="trust me",
                                         state_dir=state_dir, progress=lambda message: None)
        assert [r.event for r in _approval_records(ledger, ids["four_eyes"])] == ["awaiting_approval"]

        second, output = run_with_answers(folder, [
            {"dag_id": "promote_release", "conf": {"release_id": ids["four_eyes"], "state_dir": str(state_dir),
                                                    "reason": "approved on second look"},
             "answers": [{"user": "bob", "option": "Approve", "comment": "second pair of eyes: fine"}]},
            {"dag_id": dag_id, "conf": {"overrides": overrides["rejected"]}, "answers": [
                {"user": "bob", "option": "Reject", "comment": reject_note}]},
            {"dag_id": dag_id, "conf": {"overrides": overrides["timed_out"]}, "sweep": True},
        ])
        promoted, rejected, timed_out = second["runs"]

        # The promote DAG asks again for the release still awaiting approval; bob approves it and it is promoted.
        assert promoted["state"] == "success", output[-6000:]
        assert promoted["tasks"] == {"choose": "success", "approval_request": "success", "approval": "success",
                                     "approval_decision": "success", "promote": "success", "rollback": "skipped"}
        assert promoted["xcom"]["promote"]["status"] == "promoted"
        decision = _approval_records(ledger, ids["four_eyes"])[-1]
        assert (decision.event, decision.payload["by"], decision.payload["reason"]) == (
            "approved", "bob", "second pair of eyes: fine")
        assert ledger.served_at("tiny-approval", "2100-01-01T00:00:00Z").release_id == ids["four_eyes"]

        # bob rejects: promote skips with the reason, the release ends rejected, the champion serves on.
        assert rejected["hitl"]["answers"][0]["status"] == 200
        assert rejected["state"] == "success" and rejected["tasks"]["approval"] == "success"
        assert rejected["xcom"]["approval_decision"]["decision"] == "rejected"
        assert rejected["xcom"]["promote"]["event"] == "skipped"
        assert rejected["xcom"]["promote"]["reason"] == f"not approved: {reject_note}"
        assert rejected["xcom"]["end"]["status"] == "rejected"
        decision = _approval_records(ledger, ids["rejected"])[-1]
        assert (decision.event, decision.payload["by"], decision.payload["reason"]) == ("rejected", "bob", reject_note)
        final = [r for r in ledger.release(ids["rejected"]) if r.stage == "release"][-1]
        assert (final.event, final.payload.get("reason")) == ("rejected", f"not approved: {reject_note}")

        # Nobody answers: the scheduler's sweep applies the default (Reject, no responder); the ledger records
        # timed_out.
        assert timed_out["hitl"]["swept"] is True and timed_out["hitl"]["answers"] == []
        assert timed_out["hitl"]["after"]["responded_by_user"] is None
        assert timed_out["hitl"]["after"]["chosen_options"] == ["Reject"]
        assert timed_out["state"] == "success", output[-6000:]
        assert timed_out["xcom"]["approval_decision"]["decision"] == "timed_out"
        assert timed_out["xcom"]["end"]["status"] == "rejected"
        assert "nobody approved it within" in timed_out["xcom"]["promote"]["reason"]
        assert [r.event for r in _approval_records(ledger, ids["timed_out"])] == ["awaiting_approval", "timed_out"]

        assert ledger.served_at("tiny-approval", "2100-01-01T00:00:00Z").release_id == ids["four_eyes"]
        assert ledger.verify().ok
        hosting = ProcessSupervisor(state_dir)
        assert [e["name"] for e in hosting.list_endpoints()] == ["shiplift-tiny-approval-prod"], "candidates torn down"
    finally:
        if (state_dir / "endpoints").is_dir():
            hosting = ProcessSupervisor(state_dir)
            for endpoint in hosting.list_endpoints():
                hosting.delete_endpoint(endpoint["name"])


def test_a_refresh_dag_waits_only_when_its_config_requires_an_approval(tmp_path, shiplift_dags, tiny_release):
    """The approval tasks sit between validate and promote only in the DAG of a config that requires an approval;
    promote runs whether or not anybody was asked, never after a failure."""
    plain = tiny_release.write_tiny_config(tmp_path, tmp_path / "state")
    asking = tiny_release.write_tiny_config(tmp_path, tmp_path / "state", name="tiny-asking",
                                            promotion__approval={"required": True, "approvers": ["alice"]})
    assert "approval" not in shiplift_dags.refresh_dag(str(plain)).task_ids
    dag = shiplift_dags.refresh_dag(str(asking))
    dag.validate()  # what the DAG processor checks (setup tasks followed by all_success, …)
    assert dag.get_task("approval_request").upstream_task_ids == {"begin", "validate"}
    assert dag.get_task("approval").upstream_task_ids == {"approval_request"}
    assert dag.get_task("approval_decision").upstream_task_ids == {"begin", "approval"}
    promote = dag.get_task("promote")
    assert promote.upstream_task_ids == {"validate", "approval_decision"}
    assert promote.trigger_rule == "none_failed_min_one_success"
    approval = dag.get_task("approval")
    assert approval.response_timeout.total_seconds() == 72 * 3600 and approval.execution_timeout is not None
    assert approval.defaults == ["Reject"]


if __name__ == "__main__":
    main(sys.argv[1])
