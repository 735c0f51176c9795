#!/usr/bin/env bash
# `make airflow`: a local Airflow 3 (LocalExecutor, SQLite) showing this checkout's DAGs on 127.0.0.1.
#   AIRFLOW_HOME  = .airflow            (override: SHIPLIFT_AIRFLOW_HOME)
#   DAGs          = dags/               (override: SHIPLIFT_AIRFLOW_DAGS)
#   SHIPLIFT_HOME = .shiplift/airflow   (the local backend's state for the DAG runs)
#   port          = a free one, printed (override: AIRFLOW_PORT)
# Prints the URL and the admin login once every component is healthy; Ctrl-C stops everything.
# `scripts/airflow_standalone.sh check [--trigger DAG_ID]` starts, lists the DAGs through the REST API, and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [ "${1:-}" = "check" ]; then
  shift
  exec "$PY" scripts/airflow_local.py check "$@"
fi
exec "$PY" scripts/airflow_local.py standalone "$@"
