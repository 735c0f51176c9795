"""The sweep DAG (issue 48 items 4 and 5): `open` records the rule's sha256 before any candidate runs, `evaluate` is
mapped over the candidates `open` returns (dynamic task mapping) in the sweep's Airflow pool, at most `parallel` at
once, and defers while its candidate's endpoint comes up (the trigger polls; no worker held), keeping the candidate's
lease across the wait; `pick` records the pick; every task is idempotent, so a second run records nothing and defers
nothing. `dag.test()` runs the mapped tasks one after another (it has no slots) and each deferral's trigger inline, so
what bounds them on a real Airflow is asserted on the DAG itself; the slow test runs six candidates through it, and
tests/celery/test_celery_sweep.py runs the same six on two Celery worker slots."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"


SWEEP_POOL = "shiplift-sweep-tiny-sweep"
# three builds of the tiny model on two nominal placements: six candidates, more than the two slots they share
SIX_CANDIDATES = {"axes": {"quantization": ["Q8_0", "F16", "Q4_0"],
                           "placement": [{"kind": "instance_type", "instance_type": "ml.c7i.xlarge"},
                                         {"kind": "instance_type", "instance_type": "ml.m5.large"}]},
                  "candidates": "product"}


def tiny_sweep(root: Path, tiny_release, **changes) -> Path:
    """The e2e tests' tiny sweep (two quantizations of the tiny model, 12 tasks), two at once, with `changes` to its
    top-level keys (SIX_CANDIDATES); state in root/state."""
    from tests.e2e.test_sweep_run import write_sweep

    base = tiny_release.write_tiny_config(root / "configs", root / "state")
    path = write_sweep(root / "sweeps", base, n_tasks=12, constraints=[{"metric": "valid_rate", "at_least": 1.0}])
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "parallel": 2, **changes}))
    return path


@pytest.fixture
def sweep_path(tmp_path, tiny_release) -> Path:
    """The tiny sweep of two candidates, state in tmp_path/state."""
    return tiny_sweep(tmp_path, tiny_release)


def set_pool(airflow_env: dict[str, str], name: str, slots: int) -> None:
    """Create (or resize) an Airflow pool with the CLI, as docs/airflow.md says to before a sweep's first run."""
    pool = subprocess.run([sys.executable, "-m", "airflow", "pools", "set", name, str(slots), "tiny sweep"],
                          env=airflow_env, capture_output=True, text=True, timeout=120)
    assert pool.returncode == 0, pool.stdout[-2000:] + pool.stderr[-2000:]


def sweep_folder(tmp_path: Path, sweep: Path) -> Path:
    """A dags folder holding the shared wiring and one sweep DAG file of `sweep`, like dags/."""
    folder = tmp_path / "dags"
    folder.mkdir()
    for shared in ("_shiplift_dags.py", "_shiplift_triggers.py", "_shiplift_sweeps.py"):
        (folder / shared).symlink_to(DAGS / shared)
    (folder / ".airflowignore").write_text((DAGS / ".airflowignore").read_text())
    (folder / "sweep_tiny_sweep.py").write_text(  # "airflow" and "dag" in it, or the DAG processor skips the file
        f'"""Airflow sweep DAG of a test sweep."""\n\nfrom _shiplift_sweeps import sweep_dag\n\n'
        f"dag = sweep_dag({str(sweep)!r})\n")
    return folder


def test_the_shipped_sweep_dag_maps_evaluate_over_the_candidates_in_its_pool(dagbag):
    from shiplift.tasks.sweeps.config import read_sweep_config

    config = read_sweep_config(ROOT / "configs" / "sweeps" / "gemma-decision-quant.yaml")
    dag = dagbag.dags["sweep_gemma_decision_quant"]
    evaluate = dag.get_task("evaluate")
    assert evaluate.pool == f"shiplift-sweep-{config.name}" and evaluate.max_active_tis_per_dagrun == config.parallel
    assert f"airflow pools set shiplift-sweep-{config.name} {config.parallel}" in dag.doc_md


def test_the_sweep_dag_s_graph_pool_and_timeouts(shiplift_dags, sweep_path):
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    from shiplift.tasks.sweeps.config import load_sweep
    from shiplift.tasks.sweeps.orchestrated import evaluation_timeout_s
    from shiplift.tasks.sweeps.policy import EVALUATE_RETRIES

    sweeps = importlib.import_module("_shiplift_sweeps")
    dag = sweeps.sweep_dag(str(sweep_path))
    assert dag.dag_id == "sweep_tiny_sweep"
    evaluate = dag.get_task("evaluate")
    assert isinstance(evaluate, MappedOperator), "one task instance per candidate, made at run time"
    assert evaluate.operator_class is sweeps.CandidateEvaluation, "deferrable: the endpoint's wait holds no worker"
    assert (evaluate.pool, evaluate.pool_slots, evaluate.max_active_tis_per_dagrun) == (SWEEP_POOL, 1, 2)
    assert evaluate.execution_timeout == timedelta(seconds=evaluation_timeout_s(load_sweep(sweep_path)))
    assert evaluate.retries == EVALUATE_RETRIES and evaluate.retry_policy is shiplift_dags.RETRY_POLICY
    assert (evaluate.upstream_task_ids, evaluate.downstream_task_ids) == ({"open"}, {"pick"})
    assert dag.get_task("release_pick").upstream_task_ids == {"pick"}


def test_the_candidate_trigger_round_trips_through_its_classpath(shiplift_dags):
    triggers = importlib.import_module("_shiplift_triggers")
    trigger = triggers.CandidatePollTrigger(sweep_path="/srv/sweeps/s.yaml", candidate="Q8_0", release_id="r-0",
                                            stage="deploy_candidate", holder="h", every_s=30, state_dir="/srv")
    classpath, kwargs = trigger.serialize()
    assert classpath == "_shiplift_triggers.CandidatePollTrigger"
    assert (kwargs["sweep_path"], kwargs["candidate"]) == ("/srv/sweeps/s.yaml", "Q8_0")
    assert triggers.CandidatePollTrigger(**kwargs).serialize() == (classpath, kwargs)


def deferred_starts(ledger, sweep) -> list[str]:
    """The candidates whose deploy_candidate was started by a deferring step (its `started` record says deferred)."""
    return [c.name for c in sweep.candidates if any(
        (r.stage, r.event, r.payload.get("deferred")) == ("deploy_candidate", "started", True)
        for r in ledger.release(c.release_id))]


def test_a_deferred_candidate_keeps_its_lease_from_its_start_through_its_polls_to_its_evidence(
        tmp_path, sweep_path, tiny_release):
    """The first half takes the candidate's lease by the run's name and keeps it past its step, so another run is
    refused mid-deploy; each poll renews it; the second half records the evidence and gives it back. A poll after
    another run took the candidate over fails (LeaseLost), recording nothing, and the second half then leaves the
    candidate alone (LeaseHeld); once the run has it again, that half tears it down and records the failure."""
    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
    from shiplift.tasks.backends.registry import open_ledger
    from shiplift.tasks.errors import LeaseHeld, LeaseLost
    from shiplift.tasks.ledger import events
    from shiplift.tasks.ledger.release_state import ReleaseState
    from shiplift.tasks.ledger.sweep_records import SweepRecords
    from shiplift.tasks.sweeps import orchestrated
    from shiplift.tasks.sweeps.config import load_sweep
    from shiplift.tasks.sweeps.records import CANDIDATE_LEASE_TTL_S, candidate_lease_key

    run, other = "airflow:sweep_tiny_sweep/run-1", "airflow:sweep_tiny_sweep/run-2"
    sweep, state_dir = load_sweep(sweep_path), tmp_path / "state"
    first, second = sweep.candidates

    def quiet(_: str) -> None:
        pass

    def poll(candidate, started, actor=run) -> dict:
        return orchestrated.poll_candidate_orchestrated(sweep_path, candidate.name, started["stage"], actor=actor,
                                                        ledger_url=started["ledger_url"],
                                                        state_dir=started["state_dir"], progress=quiet)

    orchestrated.open_orchestrated(sweep_path, actor=run, progress=quiet)
    ledger = open_ledger(state_dir=state_dir)
    try:
        started = orchestrated.start_candidate_orchestrated(sweep_path, first.name, actor=run, progress=quiet)
        assert started["stage"] == "deploy_candidate"
        with pytest.raises(LeaseHeld, match=run):
            ledger.acquire_lease(candidate_lease_key(first), other, first.release_id, CANDIDATE_LEASE_TTL_S)
        with pytest.raises(LeaseHeld, match="being evaluated by another run"):
            orchestrated.start_candidate_orchestrated(sweep_path, first.name, actor=other, progress=quiet)
        deadline = time.monotonic() + 120
        while not poll(first, started)["done"]:
            assert time.monotonic() < deadline, "the tiny candidate's endpoint came up"
            time.sleep(0.5)  # the trigger's interval between polls, shortened
        assert orchestrated.finish_candidate_orchestrated(sweep_path, first.name, actor=run,
                                                          progress=quiet)["candidate"] == first.name
        assert first.name in SweepRecords.read(ledger, sweep.sweep_id).evaluated
        ledger.acquire_lease(candidate_lease_key(first), other, first.release_id, CANDIDATE_LEASE_TTL_S)
        ledger.release_lease(candidate_lease_key(first), other)  # given back: another run takes it at once

        started = orchestrated.start_candidate_orchestrated(sweep_path, second.name, actor=run, progress=quiet)
        ledger.release_lease(candidate_lease_key(second), run)  # as if it had expired, and another run took it
        ledger.acquire_lease(candidate_lease_key(second), other, second.release_id, CANDIDATE_LEASE_TTL_S)
        with pytest.raises(LeaseLost):
            poll(second, started)
        lost = LeaseLost("the candidate's lease was taken over")
        with pytest.raises(LeaseHeld):
            orchestrated.finish_candidate_orchestrated(sweep_path, second.name, actor=run, failure=lost,
                                                       progress=quiet)
        assert ReleaseState.load(ledger, second.release_id).stage("deploy_candidate")["status"] == "started", \
            "the other run's candidate: nothing recorded, nothing torn down"
        ledger.release_lease(candidate_lease_key(second), other)
        with pytest.raises(LeaseLost):
            orchestrated.finish_candidate_orchestrated(sweep_path, second.name, actor=run, failure=lost,
                                                       progress=quiet)
        assert ReleaseState.load(ledger, second.release_id).stage(events.TEARDOWN)["status"] == "succeeded"
        assert ProcessSupervisor(state_dir).list_endpoints() == [], "both candidates torn down"
        assert second.name in SweepRecords.read(ledger, sweep.sweep_id).failed
        assert deferred_starts(ledger, sweep) == [first.name, second.name]
    finally:
        ledger.close()
        tiny_release.stop_endpoints(state_dir)


def test_a_sweep_dag_run_evaluates_every_candidate_picks_and_a_second_run_records_nothing(
        tmp_path, sweep_path, airflow_env, run_dags, tiny_release):
    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
    from shiplift.tasks.backends.registry import open_ledger
    from shiplift.tasks.ledger import events
    from shiplift.tasks.ledger.release_state import ReleaseState
    from shiplift.tasks.ledger.sweep_records import SweepRecords, explanation
    from shiplift.tasks.sweeps.config import load_sweep

    set_pool(airflow_env, SWEEP_POOL, 2)
    sweep, state_dir = load_sweep(sweep_path), tmp_path / "state"
    try:
        folder = sweep_folder(tmp_path, sweep_path)
        result, output = run_dags(folder, [{"dag_id": "sweep_tiny_sweep"}], timeout_s=540)
        first = result["runs"][0]
        assert result["import_errors"] == {}
        assert first["state"] == "success", output[-5000:]
        assert first["tasks"] == {"open": "success", "evaluate": "success", "pick": "success",
                                  "release_pick": "skipped"}
        assert first["xcom"]["open"] == [c.name for c in sweep.candidates]
        assert output.count("running trigger in line") == len(sweep.candidates), "each candidate's deploy deferred"
        ledger = open_ledger(state_dir=state_dir)
        assert deferred_starts(ledger, sweep) == [c.name for c in sweep.candidates]
        own = ledger.release(sweep.sweep_id)
        assert [r.event for r in own] == [events.OPENED, events.EVALUATED, events.EVALUATED, events.PICKED]
        assert all(r.actor.startswith("airflow:sweep_tiny_sweep/") for r in own)
        records = SweepRecords.load(ledger, sweep.sweep_id)
        assert first["xcom"]["pick"]["picked"] == records.recorded_pick().picked and explanation(records)["agrees"]
        for candidate in sweep.candidates:
            state = ReleaseState.load(ledger, candidate.release_id)
            assert own[0].seq < state.records[0].seq, "opened before any candidate ran"
            assert state.status == events.SWEPT
            assert state.stage(events.DEPLOY_CANDIDATE)["status"] == "torn_down"
        assert ProcessSupervisor(state_dir).list_endpoints() == [], "every candidate torn down"
        head = ledger.head().seq
        ledger.close()

        again, output = run_dags(folder, [{"dag_id": "sweep_tiny_sweep"}], timeout_s=300)
        assert again["runs"][0]["state"] == "success", output[-5000:]
        assert again["runs"][0]["xcom"]["pick"] == first["xcom"]["pick"]
        assert "running trigger in line" not in output, "candidates with evidence defer nothing"
        ledger = open_ledger(state_dir=state_dir)
        assert ledger.head().seq == head, "a second run finds everything in the ledger and records nothing"
        ledger.close()
    finally:
        tiny_release.stop_endpoints(state_dir)


@pytest.mark.slow  # 133 to 182 s on two busy cores: the six candidates one after another
def test_a_six_candidate_sweep_completes_under_dag_test(tmp_path, airflow_env, run_dags, tiny_release):
    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
    from shiplift.tasks.backends.registry import open_ledger
    from shiplift.tasks.ledger import events
    from shiplift.tasks.ledger.sweep_records import SweepRecords, explanation
    from shiplift.tasks.sweeps.config import load_sweep

    set_pool(airflow_env, SWEEP_POOL, 2)
    path = tiny_sweep(tmp_path, tiny_release, **SIX_CANDIDATES)
    sweep, state_dir = load_sweep(path), tmp_path / "state"
    assert len(sweep.candidates) == 6
    try:
        result, output = run_dags(sweep_folder(tmp_path, path), [{"dag_id": "sweep_tiny_sweep"}], timeout_s=540)
        run = result["runs"][0]
        assert run["state"] == "success", output[-5000:]
        assert run["xcom"]["open"] == [c.name for c in sweep.candidates]
        assert output.count("running trigger in line") == 6, "each candidate's deploy deferred"
        ledger = open_ledger(state_dir=state_dir)
        assert deferred_starts(ledger, sweep) == [c.name for c in sweep.candidates]
        assert [r.event for r in ledger.release(sweep.sweep_id)] == [events.OPENED, *[events.EVALUATED] * 6,
                                                                     events.PICKED]
        records = SweepRecords.load(ledger, sweep.sweep_id)
        assert set(records.evaluated) == {c.name for c in sweep.candidates}
        assert run["xcom"]["pick"]["picked"] == records.recorded_pick().picked and explanation(records)["agrees"]
        ledger.close()
        assert ProcessSupervisor(state_dir).list_endpoints() == [], "every candidate torn down"
    finally:
        tiny_release.stop_endpoints(state_dir)
