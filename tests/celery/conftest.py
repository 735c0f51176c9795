"""An Airflow CeleryExecutor deployment on loopback: PostgreSQL metadata DB, Redis broker, this checkout's DAGs.

Runs only with `-m celery` (`make test-celery`). Skips, saying which, when PostgreSQL on
127.0.0.1:5432 (user postgres, trust auth) or Redis on 127.0.0.1:6379 cannot be reached, and, outside
`make test-celery`, when pyproject.toml's `celery` extra (Airflow's Celery provider, celery[redis], redis,
asyncpg) is not installed; `make test-celery` installs that extra, and under it (scripts/airflow_celery_test.sh
sets SHIPLIFT_CELERY_EXTRA_REQUIRED=1) a missing extra fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import sys
import time
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import airflow_local  # noqa: E402  (scripts/ is not a package)

PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"
DATABASE = os.environ.get("SHIPLIFT_CELERY_DATABASE", "shiplift_airflow")
REDIS_URL = "redis://127.0.0.1:6379/0"
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer", "celery-worker")  # the deploy defers
START_DEADLINE_S = 180.0
EXTRA_REQUIRED_ENV = "SHIPLIFT_CELERY_EXTRA_REQUIRED"  # set by scripts/airflow_celery_test.sh (make test-celery)


def pytest_configure(config):
    config.addinivalue_line("markers",
                            "celery: needs PostgreSQL and Redis on loopback; runs Airflow's CeleryExecutor (make "
                            "test-celery)")


def _celery_extra_missing() -> list[str]:
    """The distributions of pyproject.toml's `celery` extra that are not installed in this interpreter."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    missing = []
    for requirement in project["optional-dependencies"]["celery"]:
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def _require_celery_extra() -> None:
    """Skip (fail under make test-celery) when the celery extra is absent, before anything is started."""
    missing = _celery_extra_missing()
    if not missing:
        return
    problem = (f"the celery extra is not installed in {sys.prefix} (missing: {', '.join(missing)}); "
               "`make test-celery` installs it (pip install -e '.[dev,demo,celery]') and runs this suite")
    if os.environ.get(EXTRA_REQUIRED_ENV) == "1":
        pytest.fail(f"{problem}; {EXTRA_REQUIRED_ENV}=1 says it must be there", pytrace=False)
    pytest.skip(problem)


def _pg_connect(dbname: str):
    import psycopg2

    connection = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=dbname, connect_timeout=3)
    connection.autocommit = True
    return connection


def _postgres_problem() -> str | None:
    try:
        _pg_connect("postgres").close()
    except Exception as exc:  # psycopg2.OperationalError and friends: any failure means unreachable here
        return f"PostgreSQL at {PG_HOST}:{PG_PORT} (user {PG_USER}, trust auth) is unreachable: {str(exc).strip()}"
    return None


def _redis_problem() -> str | None:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=3) as sock:
            sock.settimeout(3)
            sock.sendall(b"PING\r\n")
            answer = sock.recv(64)
    except OSError as exc:
        return f"Redis at 127.0.0.1:6379 is unreachable: {exc}"
    if not answer.startswith(b"+PONG"):
        return f"Redis at 127.0.0.1:6379 answered PING with {answer!r}"
    return None


def _admin_sql(*statements: str) -> None:
    """Run statements outside a transaction (CREATE/DROP DATABASE refuse to run inside one)."""
    connection = _pg_connect("postgres")
    try:
        with connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
    finally:
        connection.close()


def _recreate_database() -> None:
    _admin_sql(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)', f'CREATE DATABASE "{DATABASE}"')


def _drop_database() -> None:
    _admin_sql(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


def _forget_queue(queue: str) -> None:
    """Delete the Redis keys Celery made for this run's private queue (nothing else on the shared broker)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"*{queue}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _stop_endpoints(state_dir: Path) -> None:
    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor

    if not (state_dir / "endpoints").is_dir():
        return
    hosting = ProcessSupervisor(state_dir)
    for endpoint in hosting.list_endpoints():
        hosting.delete_endpoint(endpoint["name"])


@dataclass
class CeleryAirflow:
    """A running CeleryExecutor deployment and what a test needs to drive and inspect it."""

    api: airflow_local.AirflowApi
    supervisor: airflow_local.Supervisor
    queue: str
    state_dir: Path
    home: Path
    timings: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def celery_dags_folder() -> Path:
    """The DAGs folder the deployment parses and its worker runs: this checkout's dags/. A test module overrides this
    fixture to deploy DAGs of its own (tests/celery/test_celery_sweep.py, a sweep DAG of a tiny test sweep)."""
    return ROOT / "dags"


@pytest.fixture(scope="module")
def celery_airflow(tmp_path_factory, celery_dags_folder):
    """Fresh database and private queue; api-server, scheduler, dag-processor, celery worker (two slots: --concurrency
    2, scripts/airflow_local.py); all stopped after."""
    _require_celery_extra()
    problems = [p for p in (_postgres_problem(), _redis_problem()) if p]
    if problems:
        pytest.skip("; ".join(problems))
    base = tmp_path_factory.mktemp("celery")
    home, state_dir = base / "airflow", base / "shiplift"
    home.mkdir()
    state_dir.mkdir()
    queue = f"shiplift-test-{secrets.token_hex(4)}"
    database_url = f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/{DATABASE}"
    env = airflow_local.celery_env(home, port=airflow_local.free_port(), dags_folder=celery_dags_folder,
                                   shiplift_home=state_dir,
                                   database_url=database_url, broker_url=REDIS_URL, queue=queue)
    log_dir = home / "logs" / "components"
    timings: dict[str, float] = {}
    began = time.monotonic()
    _recreate_database()
    supervisor = airflow_local.Supervisor(env, log_dir)
    try:
        timings["db_migrate_s"] = round(airflow_local.migrate_db(env, log_dir), 1)
        for name in COMPONENTS:
            supervisor.start(name, airflow_local.component_command(name, queue=queue))
        api = airflow_local.AirflowApi(env["AIRFLOW__API__BASE_URL"])
        airflow_local.wait_for("api-server, scheduler and dag-processor healthy",
                               lambda: airflow_local.components_healthy(api, COMPONENTS),
                               deadline_s=START_DEADLINE_S, alive=supervisor.check_alive)
        api.login(airflow_local.ADMIN_USER, airflow_local.admin_password(home))
        timings["startup_s"] = round(time.monotonic() - began, 1)
        yield CeleryAirflow(api=api, supervisor=supervisor, queue=queue, state_dir=state_dir, home=home,
                            timings=timings)
    finally:
        stop_began = time.monotonic()
        codes = supervisor.stop()
        timings["stop_s"] = round(time.monotonic() - stop_began, 1)
        _stop_endpoints(state_dir)
        _forget_queue(queue)
        _drop_database()
        print(f"\ncelery timings: {json.dumps(timings)}; exit codes: {json.dumps(codes)}; logs: {log_dir}")
