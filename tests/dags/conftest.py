"""Airflow for the DAG tests: a throw-away AIRFLOW_HOME, SQLite metadata DB, this project's DAGs.

Importing Airflow reads (and may write) $AIRFLOW_HOME/airflow.cfg, so a temporary home is set
before any test here imports it. Runs that need the metadata DB (`dag.test()`) happen in a
subprocess (tests/dags/run_dag.py) with their own environment, so no Airflow global state leaks
between tests or into other suites.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
RUNNER = ROOT / "scripts" / "run_dag.py"
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="shiplift-airflow-home-")
    atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], ignore_errors=True)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


@pytest.fixture(scope="session")
def dagbag():
    """This project's dags/ folder parsed the way Airflow's DAG processor parses a bundle."""
    from airflow.dag_processing.dagbag import BundleDagBag

    return BundleDagBag(dag_folder=DAGS, bundle_path=DAGS)


@pytest.fixture(scope="session")
def shiplift_dags(dagbag):
    """dags/_shiplift_dags.py, imported as the DAG files import it (the bundle folder is on sys.path)."""
    return importlib.import_module("_shiplift_dags")


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory) -> dict[str, str]:
    """Environment of a migrated SQLite Airflow home (migrated once per session)."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    }
    migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    return env


@pytest.fixture
def run_dags(airflow_env, tmp_path):
    """Run `dag.test()` for DAGs of a dags folder in a subprocess; returns (result JSON, full output)."""

    def run(dags_folder: Path, runs: list[dict], timeout_s: float = 240,
            env: dict[str, str] | None = None) -> tuple[dict, str]:
        spec = tmp_path / "dag-test-spec.json"
        spec.write_text(json.dumps({"dags_folder": str(dags_folder), "runs": runs}))
        env = {**(airflow_env if env is None else env), "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder)}
        done = subprocess.run([sys.executable, str(RUNNER), str(spec)], env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        output = done.stdout + done.stderr
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, output[-5000:]
        return json.loads(lines[-1].removeprefix("RESULT ")), output

    return run


@pytest.fixture
def dags_for_configs(tmp_path):
    """A dags folder holding one refresh DAG file per given config (plus the shared wiring), like dags/."""

    def make(*configs: Path) -> Path:
        folder = tmp_path / "dags"
        folder.mkdir(exist_ok=True)
        for shared in ("_shiplift_dags.py", "_shiplift_triggers.py"):
            (folder / shared).symlink_to(DAGS / shared)
        (folder / ".airflowignore").write_text((DAGS / ".airflowignore").read_text())
        for config in configs:
            dag_id = "refresh_" + config.stem.replace("-", "_")
            (folder / f"{dag_id}.py").write_text(
                f'"""Airflow refresh DAG of a test config."""\n\nfrom _shiplift_dags import refresh_dag\n\n'
                f"dag = refresh_dag({str(config)!r})\n"
            )
        return folder

    return make
