#!/usr/bin/env bash
# `make test-celery`: run a refresh DAG on Airflow's CeleryExecutor with a PostgreSQL metadata
# database (127.0.0.1:5432, user postgres, trust auth; database shiplift_airflow, dropped and
# recreated for a clean run, dropped after) and a Redis broker (redis://127.0.0.1:6379/0, a private
# queue per run). Skips, saying why, only when PostgreSQL or Redis cannot be reached. Needs
# pyproject.toml's `celery` extra, which `make test-celery` installs first; here a missing extra
# fails the run instead of skipping it (tests/celery/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export SHIPLIFT_CELERY_EXTRA_REQUIRED=1
exec "$PY" -m pytest tests/celery -m celery -s "$@"
