"""Run DAGs with `dag.test()` in a fresh process (its own Airflow settings) and print the outcome as JSON.

Usage: python scripts/run_dag.py SPEC.json, where SPEC = {"dags_folder": ..., "runs": [{"dag_id": ..., "conf": {...}}]}.
The last stdout line is `RESULT {json}`: import errors, and per run its state, task states, return
XComs (as stored JSON) and seconds, or the ParamValidationError that refused it and how many
runs of that DAG exist afterwards.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from airflow.dag_processing.dagbag import BundleDagBag
from airflow.exceptions import ParamValidationError
from airflow.models.dagrun import DagRun
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session


def run_one(dag, conf: dict | None) -> dict:
    """One `dag.test()` run, summarised as small JSON."""
    began = time.monotonic()
    try:
        dag_run = dag.test(run_conf=conf)
    except ParamValidationError as exc:
        with create_session() as session:
            n_runs = session.query(DagRun).filter(DagRun.dag_id == dag.dag_id).count()
        return {"dag_id": dag.dag_id, "param_error": str(exc), "n_dag_runs": n_runs}
    seconds = time.monotonic() - began
    with create_session() as session:
        xcoms = {
            row.task_id: row.value
            for row in session.query(XComModel).filter(
                XComModel.dag_id == dag.dag_id, XComModel.run_id == dag_run.run_id, XComModel.key == "return_value"
            )
        }
    return {
        "dag_id": dag.dag_id,
        "state": str(dag_run.state),
        "tasks": {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()},
        "xcom": xcoms,
        "seconds": round(seconds, 3),
    }


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    folder = Path(spec["dags_folder"])
    bag = BundleDagBag(dag_folder=folder, bundle_path=folder)
    result = {"import_errors": {str(k): str(v) for k, v in bag.import_errors.items()}, "runs": []}
    for run in spec["runs"]:
        result["runs"].append(run_one(bag.get_dag(run["dag_id"]), run.get("conf")))
    print("RESULT " + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
