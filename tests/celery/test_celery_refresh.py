"""The refresh DAG on Airflow's CeleryExecutor (PostgreSQL metadata DB, Redis broker), driven through the REST API.

The release is `configs/releases/demo-broken-model.yaml` (a tiny random GGUF the project
generates, seed 7, quantized to Q8_0 for real) with DAG-param overrides that let it pass its
gates, so it is promoted and served: the DAG factory reads configs only from configs/releases/,
and `overrides` is its documented way to change one run. State goes to a temp SHIPLIFT_HOME.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.ledger.events import STAGES
from shiplift.tasks.ledger.store import Ledger

pytestmark = pytest.mark.celery

DAG_ID = "refresh_demo_broken_model"
MODEL = "gemma-decision"  # demo-broken-model extends gemma-decision: the same model slot
PRODUCTION = f"shiplift-{MODEL}-prod"
GATES_A_RANDOM_MODEL_PASSES = [
    "validation.thresholds.min_allowed_token_mass=0.0",  # the gate that rejects a random model
    "validation.thresholds.min_accuracy=0.0",
    "validation.thresholds.max_ece=1.0",
    "validation.n_bootstrap=200",
]
N_TASKS = 16
PARSE_DEADLINE_S = 120.0
RUN_DEADLINE_S = 420.0
EXPECTED_TASKS = {"begin", *STAGES, "end"}


def ask(url: str) -> dict:
    body = json.dumps({"decision": {"id": "q", "state": "The sky is blue.", "question": "Is the sky blue?",
                                    "options": [{"id": "no", "description": "no"},
                                                {"id": "yes", "description": "yes"}]}})
    request = urllib.request.Request(f"{url}/invocations", data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "X-Amzn-SageMaker-Inference-Component": f"shiplift-{MODEL}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["result"]


def small_decision_set(folder: Path) -> Path:
    """The first N_TASKS test-split tasks of the project's decision set: a short validate stage."""
    from shiplift.tasks.project import BUILTIN_DATA_DIR

    rows = [line for line in (BUILTIN_DATA_DIR / "decisions.jsonl").read_text().splitlines()
            if json.loads(line)["split"] == "test"][:N_TASKS]
    path = folder / "decisions-small.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_refresh_dag_promotes_a_release_on_celery_workers(celery_airflow, tmp_path):
    api, supervisor = celery_airflow.api, celery_airflow.supervisor
    overrides = [*GATES_A_RANDOM_MODEL_PASSES, f"validation.datasets=[{{path: '{small_decision_set(tmp_path)}'}}]"]
    began = time.monotonic()
    from airflow_local import ADMIN_USER, wait_for

    wait_for(f"{DAG_ID} parsed", lambda: DAG_ID in api.dag_ids(), deadline_s=PARSE_DEADLINE_S,
             alive=supervisor.check_alive)
    assert api.import_errors() == [], "every DAG in dags/ imports on the dag-processor"
    celery_airflow.timings["dag_parsed_s"] = round(time.monotonic() - began, 1)

    api.unpause(DAG_ID)
    run_began = time.monotonic()
    run_id = api.trigger(DAG_ID, {"overrides": overrides})
    run = api.wait_run(DAG_ID, run_id, deadline_s=RUN_DEADLINE_S, alive=supervisor.check_alive)
    celery_airflow.timings["run_s"] = round(time.monotonic() - run_began, 1)
    instances = api.task_instances(DAG_ID, run_id)
    states = {ti["task_id"]: ti["state"] for ti in instances}
    assert run["state"] == "success", \
        f"run {run_id} ended {run['state']}: {states}; logs under {celery_airflow.home}/logs"
    assert states == {task_id: "success" for task_id in EXPECTED_TASKS}
    assert {ti["queue"]
            for ti in instances} == {celery_airflow.queue}, "every task went through this run's Celery queue"
    assert all(ti["hostname"] for ti in instances), "a Celery worker picked up every task"

    assert "validate: succeeded" in api.task_log(DAG_ID, run_id,
                                                 "validate"), "the worker's task log is readable in the UI"

    summary = api.request("GET",
                          f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/end/xcomEntries/return_value")["value"]
    assert summary["status"] == "promoted" and summary["decision"] == "pass"
    assert summary["metrics"]["n"] == N_TASKS, "the run's overrides (DAG params) reached the Celery worker"
    release_id = summary["release_id"]

    ledger = Ledger.for_sqlite(celery_airflow.state_dir / "ledger.db")
    records = ledger.release(release_id)
    assert [(r.stage, r.event) for r in records if r.event != "started"] == [
        ("release", "opened"), *((s, "succeeded") for s in STAGES),
        ("release", "promoted")], "the ledger is the release's state"
    actors = [(r.stage, r.event, r.actor) for r in records]
    # the release is opened by who triggered the run (whom four eyes keep from approving it): the REST API's user
    assert records[0].actor == ADMIN_USER, actors
    assert all(r.actor.startswith(f"airflow:{DAG_ID}/") for r in records[1:]), f"the rest name the run: {actors}"
    assert ledger.verify().ok
    with ledger.acquire_lease(MODEL, "tests/celery", release_id, 60):
        pass  # the run gave the model's promotion lease back (LeaseHeld otherwise)

    hosting = ProcessSupervisor(celery_airflow.state_dir)
    assert [e["name"] for e in hosting.list_endpoints()] == [PRODUCTION], "the candidate was torn down"
    served = hosting.describe_endpoint(PRODUCTION)["components"][f"shiplift-{MODEL}"]["spec"]["model_ref"]
    assert served["release_id"] == release_id and served["artifact_sha256"] == summary["artifact_sha256"]
    answer = ask(hosting.endpoint_url(PRODUCTION))
    assert answer["option_ids"] == ["no", "yes"] and abs(sum(answer["probabilities"]) - 1) < 1e-6
    print(f"\ncelery refresh: run {run_id} in {celery_airflow.timings['run_s']}s; release {release_id} promoted")
