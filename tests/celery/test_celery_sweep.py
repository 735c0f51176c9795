"""A sweep of six candidates on Airflow's CeleryExecutor with two worker slots (issue 48 items 4 and 5): the sweep
DAG's `evaluate` defers while its candidate's endpoint comes up (the triggerer polls; no worker slot held), so six
candidates pass through a worker of concurrency 2 and a pool of 2 slots that counts deferred tasks (a waiting
candidate's endpoint still costs), at most two at once, and the run completes.

The sweep is the DAG tests' tiny one (tests/dags/test_dags_sweep.py) with three builds of the tiny model on two
nominal placements; its DAG file lives in a test dags folder (the `celery_dags_folder` override), its state in a
temporary folder of its own. Driven and inspected through the REST API and the sweep's ledger.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.dags.test_dags_sweep import SIX_CANDIDATES, SWEEP_POOL, deferred_starts, sweep_folder, tiny_sweep

pytestmark = pytest.mark.celery

DAG_ID = "sweep_tiny_sweep"
SLOTS = 2  # the worker's concurrency (tests/celery/conftest.py) and the pool's slots
PARSE_DEADLINE_S = 120.0
RUN_DEADLINE_S = 900.0


@pytest.fixture(scope="module")
def sweep_root(tmp_path_factory) -> Path:
    """The sweep's configs, dags folder and state (ledger, endpoints), apart from the deployment's own."""
    return tmp_path_factory.mktemp("six-candidate-sweep")


@pytest.fixture(scope="module")
def six_candidate_sweep(sweep_root, tiny_release) -> Path:
    """The tiny sweep with six candidates, `parallel: 2`."""
    return tiny_sweep(sweep_root, tiny_release, **SIX_CANDIDATES)


@pytest.fixture(scope="module")
def celery_dags_folder(sweep_root, six_candidate_sweep) -> Path:
    """The deployment's DAGs: the shared wiring and the sweep DAG of the six-candidate sweep."""
    return sweep_folder(sweep_root, six_candidate_sweep)


def most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one moment; one that ends when another starts does not overlap it."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_most_at_once_counts_only_true_overlaps():
    t = [datetime(2026, 1, 1, 0, 0, s) for s in range(6)]
    assert most_at_once([(t[0], t[2]), (t[2], t[4])]) == 1, "touching is not overlapping"
    assert most_at_once([(t[0], t[3]), (t[1], t[4]), (t[2], t[5])]) == 3
    assert most_at_once([(t[0], t[2]), (t[1], t[3]), (t[3], t[5]), (t[4], t[5])]) == 2


def test_a_six_candidate_sweep_completes_on_two_celery_worker_slots(celery_airflow, six_candidate_sweep, sweep_root,
                                                                    tiny_release):
    from airflow_local import wait_for

    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
    from shiplift.tasks.backends.registry import open_ledger
    from shiplift.tasks.ledger import events
    from shiplift.tasks.ledger.release_state import ReleaseState
    from shiplift.tasks.ledger.sweep_records import SweepRecords, explanation
    from shiplift.tasks.sweeps.config import load_sweep

    api, supervisor = celery_airflow.api, celery_airflow.supervisor
    worker = supervisor.procs["celery-worker"].args
    assert worker[worker.index("--concurrency") + 1] == str(SLOTS), "the worker has two slots"
    sweep, state_dir = load_sweep(six_candidate_sweep), sweep_root / "state"
    names = [c.name for c in sweep.candidates]
    assert len(names) == 6

    wait_for(f"{DAG_ID} parsed", lambda: DAG_ID in api.dag_ids(), deadline_s=PARSE_DEADLINE_S,
             alive=supervisor.check_alive)
    assert api.import_errors() == []
    api.request("POST", "/api/v2/pools", {"name": SWEEP_POOL, "slots": SLOTS, "description": "six-candidate sweep",
                                          "include_deferred": True})
    api.unpause(DAG_ID)
    began = time.monotonic()
    run_id = api.trigger(DAG_ID)
    try:
        run = api.wait_run(DAG_ID, run_id, deadline_s=RUN_DEADLINE_S, alive=supervisor.check_alive)
        celery_airflow.timings["sweep_run_s"] = round(time.monotonic() - began, 1)
        instances = api.task_instances(DAG_ID, run_id)
        assert run["state"] == "success", \
            f"run {run_id} ended {run['state']}: {[(ti['task_id'], ti['map_index'], ti['state']) for ti in instances]}"
        evaluated = sorted((ti for ti in instances if ti["task_id"] == "evaluate"), key=lambda ti: ti["map_index"])
        assert [(ti["map_index"], ti["rendered_map_index"], ti["state"]) for ti in evaluated] == [
            (index, name, "success") for index, name in enumerate(names)]
        assert {ti["task_id"]: ti["state"] for ti in instances if ti["task_id"] != "evaluate"} == {
            "open": "success", "pick": "success", "release_pick": "skipped"}
        assert {ti["pool"] for ti in evaluated} == {SWEEP_POOL}
        assert {ti["queue"] for ti in instances if ti["state"] == "success"} == {celery_airflow.queue}

        spans = [(datetime.fromisoformat(ti["start_date"]), datetime.fromisoformat(ti["end_date"])) for ti in evaluated]
        at_once = most_at_once(spans)
        print(f"\nsix-candidate sweep: run {run_id} in {celery_airflow.timings['sweep_run_s']}s; at most {at_once} "
              f"evaluate tasks at once; spans {[(s.time().isoformat(), e.time().isoformat()) for s, e in spans]}")
        assert at_once <= SLOTS, f"{at_once} candidates ran at once on {SLOTS} slots"
        assert at_once == SLOTS, "two candidates ran at once at least once: the slots were used"

        ledger = open_ledger(state_dir=state_dir)
        own = ledger.release(sweep.sweep_id)
        assert [r.event for r in own] == [events.OPENED, *[events.EVALUATED] * 6, events.PICKED]
        assert all(r.actor.startswith(f"airflow:{DAG_ID}/") for r in own)
        records = SweepRecords.load(ledger, sweep.sweep_id)
        assert set(records.evaluated) == set(names)
        assert deferred_starts(ledger, sweep) == names, "every candidate's deploy was started, then deferred"
        assert records.recorded_pick().picked in names and explanation(records)["agrees"]
        for candidate in sweep.candidates:
            state = ReleaseState.load(ledger, candidate.release_id)
            assert state.status == events.SWEPT and state.stage(events.DEPLOY_CANDIDATE)["status"] == "torn_down"
        ledger.close()
        assert ProcessSupervisor(state_dir).list_endpoints() == [], "every candidate torn down"
    finally:
        tiny_release.stop_endpoints(state_dir)
