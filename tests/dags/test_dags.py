"""The DAGs under dags/: import, parse-time hygiene, structure, params, and one end-to-end refresh run."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
RELEASE_CONFIGS = sorted((ROOT / "configs" / "releases").glob("*.yaml"))
REFRESH_IDS = {"refresh_" + path.stem.replace("-", "_") for path in RELEASE_CONFIGS}
SWEEP_IDS = {"sweep_" + path.stem.replace("-", "_") for path in (ROOT / "configs" / "sweeps").glob("*.yaml")}
STAGES = ["resolve", "build", "package", "image", "deploy_candidate", "validate", "promote"]
PARSE_BUDGET_S = 5.0
PARSE_PROBE = r"""
import json, socket, sys, time, runpy
from pathlib import Path

def refuse(*args, **kwargs):
    raise RuntimeError("network access while parsing a DAG file")

socket.socket.connect = refuse
socket.create_connection = refuse
import sqlalchemy.engine

def no_database(*args, **kwargs):
    raise RuntimeError("database access while parsing a DAG file")

sqlalchemy.engine.Engine.connect = no_database
import airflow.sdk  # Airflow's own import cost is not the DAG file's
folder = Path(sys.argv[1])
sys.path.insert(0, str(folder))
files = {}
for path in sorted(folder.glob("*.py")):
    if path.name.startswith("_"):
        continue
    began = time.monotonic()
    namespace = runpy.run_path(str(path), run_name=path.stem)
    files[path.stem] = {"seconds": time.monotonic() - began, "dag_id": namespace["dag"].dag_id}
loaded = [name for name in ("shiplift.tasks.pipeline.release", "shiplift.tasks.ledger.store",
                            "shiplift.tasks.backends.registry", "numpy", "shiplift.validation.metrics",
                            "shiplift.validation.gates") if name in sys.modules]
print(json.dumps({"files": files, "loaded": loaded}))
"""


def test_every_dag_file_imports_and_dag_id_is_its_file_name(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == REFRESH_IDS | SWEEP_IDS | {"promote_release", "audit_ledger"}
    for dag_id, dag in dagbag.dags.items():
        assert Path(dag.fileloc).stem == dag_id
    assert "_shiplift_dags.py" in (DAGS / ".airflowignore").read_text().split()
    assert "_shiplift_dags.py" not in {Path(stat.file).name for stat in dagbag.dagbag_stats}, "ignored, not parsed"


def test_dag_files_parse_fast_without_database_network_ledger_or_evaluation_code(tmp_path):
    """Parsing reads each release config for its deadlines (the tasks' timeouts are `timeout_for` the config), and
    nothing else: no database, no ledger, no pipeline, no numpy or metrics code, no state written."""
    shiplift_home = tmp_path / "shiplift-home"
    shiplift_home.mkdir()
    env = {**os.environ, "SHIPLIFT_HOME": str(shiplift_home),
           "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'no-such-dir' / 'airflow.db'}"}
    began = time.monotonic()
    probe = subprocess.run([sys.executable, "-c", PARSE_PROBE, str(DAGS)], env=env, capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode == 0, probe.stderr[-3000:]
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    assert set(report["files"]) == REFRESH_IDS | SWEEP_IDS | {"promote_release", "audit_ledger"}
    for name, entry in report["files"].items():
        assert entry["dag_id"] == name
        assert entry["seconds"] < PARSE_BUDGET_S, f"{name} took {entry['seconds']:.2f}s to parse"
    assert report["loaded"] == [], \
        f"parse time imported {report['loaded']} (the ledger, the pipeline or evaluation code)"
    assert list(shiplift_home.iterdir()) == [], "parsing wrote shiplift state"
    assert time.monotonic() - began < 60


def test_tags_owner_retries_timeouts_and_one_run_per_model(dagbag):
    for dag in dagbag.dags.values():
        assert "shiplift" in dag.tags and len(dag.tags) >= 2
        assert dag.max_active_runs == 1 and dag.catchup is False
        for task in dag.tasks:
            assert task.owner == "ml-platform"
            assert task.execution_timeout is not None and task.execution_timeout > timedelta(0)
            assert task.retries is not None
    refresh = dagbag.dags["refresh_gemma_decision"]
    retries = {task.task_id: task.retries for task in refresh.tasks}
    for stage in ("resolve", "build", "package", "image", "deploy_candidate", "teardown_candidate"):
        assert retries[stage] >= 2, stage
        assert refresh.get_task(stage).retry_exponential_backoff > 0
        assert refresh.get_task(stage).retry_policy is not None
    from shiplift.tasks.config import load_release_config
    from shiplift.tasks.pipeline.table import STEPS, timeout_for

    assert retries == {name: STEPS[name].retries for name in retries}, "retries come from the one stage table"
    for path in RELEASE_CONFIGS:
        config, dag_id = load_release_config(path), "refresh_" + path.stem.replace("-", "_")
        for task in dagbag.dags[dag_id].tasks:
            assert task.execution_timeout == timedelta(seconds=timeout_for(task.task_id, config)), (dag_id,
                                                                                                    task.task_id)
    assert dagbag.dags["audit_ledger"].get_task("audit").retries == 1


def test_refresh_task_order_setup_and_teardown(dagbag):
    dag = dagbag.dags["refresh_gemma_decision"]
    order = ["begin", *STAGES, "teardown_candidate", "end"]
    assert sorted(dag.task_ids) == sorted(order)
    assert dag.get_task("begin").upstream_task_ids == set()
    for before, after in itertools.pairwise(order):
        expected = {before} if before == "begin" else {"begin", before}
        assert dag.get_task(after).upstream_task_ids == expected, after
    assert dag.get_task("begin").is_setup
    for name in ("teardown_candidate", "end"):
        task = dag.get_task(name)
        assert task.is_teardown and task.trigger_rule == "all_done_setup_success"
    assert dag.get_task("end").on_failure_fail_dagrun and not dag.get_task("teardown_candidate").on_failure_fail_dagrun


def test_schedules_come_from_the_configs(dagbag, shiplift_dags, tmp_path):
    config_schedule, refresh_dag = shiplift_dags.config_schedule, shiplift_dags.refresh_dag
    assert dagbag.dags["refresh_qwen35_4b_semif"].schedule == "0 3 * * 1"
    assert dagbag.dags["refresh_gemma_decision"].schedule is None
    assert dagbag.dags["refresh_demo_broken_model"].schedule is None  # inherited via extends
    child = tmp_path / "child.yaml"
    (tmp_path / "parent.yaml").write_text("schedule: '@daily'\nname: x\n")
    child.write_text("extends: parent.yaml\nname: y\n")
    assert config_schedule(child) == "@daily"
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    assert config_schedule(broken) is None and config_schedule(tmp_path / "missing.yaml") is None
    dag = refresh_dag(str(broken))
    assert dag.dag_id == "refresh_broken" and dag.schedule is None


def _validate(dag, conf: dict) -> dict:
    """What Airflow does when a run is triggered: merge the conf into the params and validate them."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag)).params.deep_merge(conf).validate()


GOOD = {"release_id": "gemma-decision-0123456789ab", "reason": "weekly refresh passed its gates"}


@pytest.mark.parametrize(
    "conf, named",
    [
        ({"reason": "r"}, "release_id"),
        ({**GOOD, "release_id": "Gemma Decision"}, "release_id"),
        ({**GOOD, "release_id": 12}, "release_id"),
        ({**GOOD, "strategy": "big_bang"}, "strategy"),
        ({**GOOD, "strategy": 3}, "strategy"),
        ({**GOOD, "rollback_target": "not-a-release"}, "rollback_target"),
        ({**GOOD, "reason": ""}, "reason"),
        ({**GOOD, "reason": "   "}, "reason"),
        ({**GOOD, "state_dir": ""}, "state_dir"),
    ],
)
def test_promotion_params_are_refused_with_the_reason(dagbag, conf, named):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=f"param {named}"):
        _validate(dagbag.dags["promote_release"], conf)


def test_the_dag_params_use_the_release_id_pattern_of_tasks(shiplift_dags):
    from shiplift.tasks.pipeline.promotion import RELEASE_ID_PATTERN

    assert shiplift_dags.RELEASE_ID_PATTERN == RELEASE_ID_PATTERN


def test_promotion_params_accept_a_rollback(dagbag):
    resolved = _validate(dagbag.dags["promote_release"],
                         {**GOOD, "rollback_target": "gemma-decision-ba9876543210", "strategy": "all_at_once"})
    assert resolved["rollback_target"] == "gemma-decision-ba9876543210" and resolved["state_dir"] is None


def test_refresh_params_take_fresh_champion_as_a_boolean_off_by_default(dagbag):
    """The `fresh_champion` param is `shiplift release --fresh-champion` (tests/unit/test_fresh_champion_runs.py)."""
    from airflow.sdk.exceptions import ParamValidationError

    refresh = dagbag.dags["refresh_gemma_decision"]
    assert _validate(refresh, {})["fresh_champion"] is False
    assert _validate(refresh, {"fresh_champion": True})["fresh_champion"] is True
    with pytest.raises(ParamValidationError, match="param fresh_champion"):
        _validate(refresh, {"fresh_champion": "yes"})


# ~75 s on 2 cores: make test-slow; make test runs a refresh DAG end to end in tests/dags/test_dags_aws.py
@pytest.mark.slow
def test_refresh_dag_end_to_end_and_a_bad_config_fails_at_begin(tmp_path, run_dags, dags_for_configs, tiny_release):
    """dag.test() on the local backend: a bad config fails at begin only; the tiny release is promoted
    (its state dir set through the DAG's `overrides` param); the promotion and audit DAGs run on it; a
    release whose validate stage raises fails the run, is torn down and gives the lease back; a release the
    gate rejects is a successful run with status rejected; an unknown conf key fails at begin."""
    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
    from shiplift.tasks.config import load_release_config
    from shiplift.tasks.ledger.events import STAGES as ALL_STAGES
    from shiplift.tasks.ledger.release_state import ReleaseState
    from shiplift.tasks.ledger.store import Ledger
    from shiplift.tasks.pipeline.release import release_id_for
    from shiplift.tasks.pipeline.table import STEPS

    state_dir, unused = tmp_path / "state", tmp_path / "state-in-the-config-file"
    config = tiny_release.write_tiny_config(tmp_path / "configs", unused)
    bad = config.with_name("bad-model.yaml")
    bad.write_text(config.read_text().replace("threads: 2", "threads: 0"))
    no_data = config.with_name("no-data.yaml")  # a dataset that is there but holds no task: validate refuses it
    (config.parent / "no-tasks.jsonl").write_text('{"not": "a decision task"}\n')  # beside decisions-small.jsonl
    no_data.write_text(config.read_text().replace("decisions-small.jsonl", "no-tasks.jsonl"))
    assert "no-tasks.jsonl" in no_data.read_text()
    strict = config.with_name("strict-model.yaml")  # the same model, a gate it cannot pass
    strict.write_text(config.read_text().replace("min_accuracy: 0.0", "min_accuracy: 0.99"))
    assert "min_accuracy: 0.99" in strict.read_text()
    folder = dags_for_configs(config, bad, no_data, strict)
    for name in ("promote_release.py", "audit_ledger.py"):
        (folder / name).write_text((DAGS / name).read_text())
    overrides = [f"backend.state_dir={state_dir}"]
    release_id = release_id_for(load_release_config(config, overrides=overrides))
    promotion = {"release_id": release_id, "reason": "re-assert the champion", "state_dir": str(state_dir)}
    try:
        result, output = run_dags(folder, [
            {"dag_id": "refresh_bad_model"},
            {"dag_id": "promote_release", "conf": {**promotion, "strategy": "yolo"}},
            {"dag_id": "refresh_tiny_decision", "conf": {"overrides": overrides}},
            {"dag_id": "promote_release", "conf": promotion},
            {"dag_id": "audit_ledger", "conf": {"state_dir": str(state_dir)}},
            {"dag_id": "refresh_no_data", "conf": {"overrides": overrides}},
            {"dag_id": "refresh_strict_model", "conf": {"overrides": overrides}},
            {"dag_id": "refresh_tiny_decision", "conf": {"overrides": overrides, "overides": ["typo"]}},
            {"dag_id": "refresh_tiny_decision", "conf": {"overrides": overrides}},
        ])
        assert result["import_errors"] == {}
        failed, refused, run, promoted, audited, broken, rejected, typo, again = result["runs"]

        assert failed["state"] == "failed" and failed["tasks"]["begin"] == "failed"
        assert all(state == "upstream_failed" for task, state in failed["tasks"].items() if task != "begin")
        assert "image.threads: Input should be greater than or equal to 1" in output
        assert "ConfigError" in output

        assert "strategy" in refused["param_error"] and refused["n_dag_runs"] == 0

        assert run["state"] == "success", output[-5000:]
        assert set(run["tasks"].values()) == {"success"}
        assert run["xcom"]["begin"]["release_id"] == release_id and not unused.exists()
        assert run["xcom"]["end"]["status"] == "promoted" and run["xcom"]["end"]["release_id"] == release_id
        for task, value in run["xcom"].items():
            assert len(json.dumps(value)) < 16_000, f"{task} pushed a large XCom"

        ledger = Ledger.for_sqlite(state_dir / "ledger.db")
        records = ledger.release(release_id)
        events = [(r.stage, r.event) for r in records if r.event != "started"]
        assert events[:len(ALL_STAGES) + 2] == [("release", "opened"), *((stage, "succeeded") for stage in ALL_STAGES),
                                                 ("release", "promoted")]
        assert all(r.actor for r in records) and ledger.verify().ok
        with ledger.acquire_lease("tiny-decision", "pytest", "tiny-decision-000000000000", 60):
            pass  # end, and the promotion DAG, gave the lease back

        assert promoted["state"] == "success" and promoted["tasks"] == {
            "choose": "success", "approval_request": "skipped", "approval": "skipped", "approval_decision": "skipped",
            "promote": "success", "rollback": "skipped"}
        assert promoted["xcom"]["promote"]["status"] == "promoted"
        served = ledger.served_at("tiny-decision", "2100-01-01T00:00:00Z")
        assert served.release_id == release_id and served.payload["reason"] == "re-assert the champion"
        assert served.actor.startswith("airflow:promote_release/")
        assert audited["state"] == "success"
        assert audited["xcom"]["audit"]["models"]["tiny-decision"]["release_id"] == release_id
        checkpoint = audited["xcom"]["audit"]["checked_against"]
        signed = next(r for r in ledger.history() if r.seq == checkpoint["seq"])
        assert checkpoint["seq"] >= served.seq and checkpoint["head_hash"] == signed.record_hash, \
            "audited against a signed checkpoint that covers the promotion"

        assert broken["state"] == "failed" and broken["tasks"]["validate"] == "failed"
        assert (broken["tasks"]["promote"], broken["tasks"]["teardown_candidate"], broken["tasks"]["end"]) == (
            "upstream_failed", "success", "failed")
        assert "dataset" in output and "no-tasks.jsonl" in output
        broken_id = broken["xcom"]["begin"]["release_id"]
        assert ReleaseState.load(Ledger.for_sqlite(state_dir / "ledger.db"), broken_id).status == "failed"
        assert ledger.served_at("tiny-decision", "2100-01-01T00:00:00Z").release_id == release_id
        with ledger.acquire_lease("tiny-decision", "pytest", "tiny-decision-000000000000", 60):
            pass  # the failed run gave the lease back too

        assert rejected["state"] == "success" and set(rejected["tasks"].values()) == {"success"}
        assert rejected["xcom"]["end"]["status"] == "rejected" and rejected["xcom"]["promote"]["event"] == "skipped"
        assert rejected["xcom"]["end"]["not_passed"] and rejected["xcom"]["end"]["decision"] == "fail"
        assert typo["state"] == "failed" and typo["tasks"]["begin"] == "failed"
        assert "unknown params ['overides']" in output

        assert again["state"] == "success" and again["xcom"]["end"]["status"] == "promoted"
        assert {task: state for task, state in again["tasks"].items() if state != "skipped"} == {
            "begin": "success", "end": "success"}, "a finished release is not run again"
        deferred = [name for name in ALL_STAGES if STEPS[name].defers is not None]
        assert deferred == ["deploy_candidate", "promote"]
        assert len(records) == 2 * len(ALL_STAGES) + len(deferred) + 4, \
            "opened, each stage once and promoted by the refresh (each deferred stage: its start's own started " \
            "record too); the promotion DAG's start and end"

        hosting = ProcessSupervisor(state_dir)
        assert [e["name"] for e in hosting.list_endpoints()] == ["shiplift-tiny-decision-prod"], "candidates torn down"
        live = hosting.describe_endpoint("shiplift-tiny-decision-prod")["components"]["shiplift-tiny-decision"]
        assert live["spec"]["model_ref"] == run["xcom"]["promote"]["served"]
        assert live["spec"]["model_ref"]["release_id"] == release_id and all(c["ping"] == 200 for c in live["copies"])
        print(f"dag.test() of the tiny refresh: {run['seconds']:.1f}s")

        hosting.delete_endpoint("shiplift-tiny-decision-prod")  # production gone behind the ledger's back: drift
        drifted, output = run_dags(folder, [{"dag_id": "audit_ledger", "conf": {"state_dir": str(state_dir)}}])
        assert drifted["runs"][0]["state"] == "failed" and drifted["runs"][0]["tasks"]["audit"] == "failed"
        assert "drift between the ledger and the live endpoints" in output
        assert f"the ledger says {release_id} serves on shiplift-tiny-decision-prod/shiplift-tiny-decision" in output
    finally:
        if (state_dir / "endpoints").is_dir():
            hosting = ProcessSupervisor(state_dir)
            for endpoint in hosting.list_endpoints():
                hosting.delete_endpoint(endpoint["name"])
