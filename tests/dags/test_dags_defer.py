"""Waits that hold no worker on Airflow (issue 48 item 5): deploy_candidate and promote, which the policy table defers,
start the candidate (production's update) on a worker, defer to `_shiplift_triggers.StagePollTrigger` (the triggerer
polls), and record the stage on a worker once the poll says in service (the update ended).

`dag.test()` runs every task one at a time and a deferred task's trigger inline, so it proves the task defers and
resumes, and the ledger it leaves, but it cannot show two runs sharing one worker slot (it has no slots). What makes the
slot free is Airflow's: a deferred task instance is not running, and a pool counts deferred tasks only where its
`include_deferred` is set (asserted here); the worker returns as soon as `execute` defers (asserted
here, in process, with a start that returns at once)."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def refresh(shiplift_dags, tiny_release, tmp_path):
    config = tiny_release.write_tiny_config(tmp_path / "configs", tmp_path / "state")
    return shiplift_dags.refresh_dag(str(config))


def test_the_table_s_deferring_stage_is_a_deferrable_task_polled_at_the_table_s_interval(shiplift_dags, refresh):
    from shiplift.tasks.pipeline.table import STEPS

    deferring = {name for name, step in STEPS.items() if step.defers}
    assert deferring == {"deploy_candidate", "promote"}
    for task in refresh.tasks:
        is_deferred = isinstance(task, shiplift_dags.DeferredStage)
        assert is_deferred == (task.task_id in deferring), task.task_id
    deploy = refresh.get_task("deploy_candidate")
    assert deploy.poll_every_s == STEPS["deploy_candidate"].defers.every_s
    assert deploy.retries == STEPS["deploy_candidate"].retries and deploy.retry_policy is shiplift_dags.RETRY_POLICY
    assert deploy.upstream_task_ids == {"begin", "image"}, "begin's XCom reaches it, image runs before it"


def test_the_trigger_round_trips_through_its_classpath(shiplift_dags):
    trigger = shiplift_dags.StagePollTrigger(release_id="r-000000000000", stage="deploy_candidate", holder="h",
                                             every_s=30, ledger_url=None, state_dir="/srv/shiplift")
    classpath, kwargs = trigger.serialize()
    assert classpath == "_shiplift_triggers.StagePollTrigger"
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (classpath, kwargs)


def test_the_trigger_polls_until_done_and_reports_a_failure_with_its_class(shiplift_dags, monkeypatch):
    """run() polls off the event loop, sleeping every_s between polls; a failure the poll raised becomes a failed
    event with the error's class, problem and fix (the poll recorded it in the ledger)."""
    from shiplift.tasks.errors import CapacityError

    answers = [{"done": False, "status": "endpoint Creating"}, {"done": True, "status": "endpoint InService"}]
    trigger = shiplift_dags.StagePollTrigger(release_id="r", stage="deploy_candidate", holder="h", every_s=0.01)
    monkeypatch.setattr(trigger, "_poll", lambda: answers.pop(0))

    async def first_event(t):
        async for event in t.run():
            return event.payload

    assert asyncio.run(first_event(trigger)) == {"status": "done", "polls": 2, "stage_status": "endpoint InService"}

    def failing():
        raise CapacityError("endpoint e: no capacity in any instance pool", fix="add instance types")

    monkeypatch.setattr(trigger, "_poll", failing)
    assert asyncio.run(first_event(trigger)) == {"status": "failed", "polls": 1, "error_type": "CapacityError",
                                                 "problem": "endpoint e: no capacity in any instance pool",
                                                 "fix": "add instance types"}


def test_execute_defers_at_once_and_execute_complete_raises_the_polled_failure_as_its_class(shiplift_dags, refresh,
                                                                                               monkeypatch):
    from airflow.sdk.exceptions import TaskDeferred

    import shiplift.tasks.pipeline.deferred as deferred
    from shiplift.tasks.errors import CapacityError, DeployFailed, is_retryable

    begun = {"release_id": "tiny-decision-000000000000", "ledger_url": "sqlite:////tmp/l.db", "state_dir": "/s",
             "status": "running"}
    started = []
    monkeypatch.setattr(deferred, "start_orchestrated", lambda *a, **k: started.append((a, k)) or {"started": {}})
    monkeypatch.setattr(shiplift_dags, "_holder", lambda: "airflow:refresh_tiny_decision/run-1")
    deploy = refresh.get_task("deploy_candidate")
    deploy.begun = begun  # as rendered from begin's XCom
    with pytest.raises(TaskDeferred) as deferral:
        deploy.execute({})
    assert started[0][0] == (begun["release_id"], "deploy_candidate")
    trigger = deferral.value.trigger
    assert (deferral.value.method_name, trigger.every_s, trigger.release_id, trigger.holder) == (
        "execute_complete", deploy.poll_every_s, begun["release_id"], "airflow:refresh_tiny_decision/run-1")
    assert deferral.value.timeout > deploy.execution_timeout, "the poll's own deadline check comes first"

    for error, retried in ((CapacityError, True), (DeployFailed, False)):
        with pytest.raises(error) as raised:
            deploy.execute_complete({}, {"status": "failed", "error_type": error.__name__, "problem": "p",
                                         "fix": "f"})
        assert (raised.value.problem, raised.value.fix, is_retryable(raised.value)) == ("p", "f", retried)

    finished = {**begun, "status": "promoted"}
    deploy.begun = finished
    from airflow.sdk.exceptions import AirflowSkipException

    with pytest.raises(AirflowSkipException):
        deploy.execute({})


def test_a_pool_that_does_not_include_deferred_tasks_counts_a_deferred_deploy_in_no_slot():
    """Why a deferred deploy frees its slot: a pool without include_deferred (the default pool is created so, and
    `airflow pools set` leaves it off unless asked) occupies slots with running and queued tasks only."""
    from airflow.models.pool import Pool
    from airflow.utils.state import TaskInstanceState

    assert TaskInstanceState.DEFERRED not in Pool(pool="p", slots=1, include_deferred=False).get_occupied_states()
    assert TaskInstanceState.DEFERRED in Pool(pool="p", slots=1, include_deferred=True).get_occupied_states()


def test_a_refresh_run_defers_its_deploy_and_the_ledger_shows_start_then_result(tmp_path, run_dags, dags_for_configs,
                                                                                 tiny_release):
    """dag.test() on the local backend: deploy_candidate and promote each defer once (the trigger runs inline), resume,
    and the run promotes; the ledger has each deferred start's `started` record, then the stage's own run and its
    result."""
    from shiplift.tasks.config import load_release_config
    from shiplift.tasks.ledger.store import Ledger
    from shiplift.tasks.pipeline.release import release_id_for

    state_dir = tmp_path / "state"
    config = tiny_release.write_tiny_config(tmp_path / "configs", tmp_path / "unused")
    overrides = [f"backend.state_dir={state_dir}"]
    release_id = release_id_for(load_release_config(config, overrides=overrides))
    try:
        result, output = run_dags(dags_for_configs(config), [
            {"dag_id": "refresh_tiny_decision", "conf": {"overrides": overrides}}])
        run = result["runs"][0]
        assert run["state"] == "success", output[-5000:]
        assert run["tasks"]["deploy_candidate"] == "success" and run["xcom"]["end"]["status"] == "promoted"
        assert output.count("running trigger in line") == 2, "deploy_candidate and promote, and only they, deferred"
        for stage in ("deploy_candidate", "promote"):
            assert f"{stage}: started (deferred: polled every 30s" in output
            records = [r for r in Ledger.for_sqlite(state_dir / "ledger.db").release(release_id) if r.stage == stage]
            assert [(r.event, r.payload.get("deferred")) for r in records] == [
                ("started", True), ("started", None), ("succeeded", None)], stage
            assert run["xcom"][stage]["endpoint"] == records[-1].payload["endpoint"]
        assert run["tasks"]["promote"] == "success"
    finally:
        tiny_release.stop_endpoints(state_dir)
