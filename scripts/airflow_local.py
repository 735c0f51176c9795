"""Run this checkout's DAGs on a local Airflow 3: LocalExecutor + SQLite, or CeleryExecutor + PostgreSQL + Redis.

`python scripts/airflow_local.py standalone` is what `make airflow` runs: the components of
`airflow standalone` (api-server, scheduler, dag-processor, triggerer) started one by one so
that every server binds 127.0.0.1 (`airflow standalone` cannot pass `--skip-serve-logs`, and
its log servers listen on all interfaces). `check` starts the same set, waits for the health
endpoint, lists the DAGs through the REST API (and with `--trigger DAG_ID` runs one DAG) and
stops everything. The Celery test (tests/celery) builds on `Supervisor`, `celery_env` and
`AirflowApi` from here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ADMIN_USER = "admin"
HTTP_TIMEOUT_S = 10.0
STOP_GRACE_S = 30.0
SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
LOCAL_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


class AirflowLocalError(RuntimeError):
    """A local Airflow component failed to start, answer or finish in time; the message says which and why."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bind port 0), never a fixed one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_env(home: Path, *, port: int, dags_folder: Path, shiplift_home: Path) -> dict[str, str]:
    """The environment of every component: AIRFLOW_HOME, this checkout's DAGs, loopback only, no examples."""
    base_url = f"http://127.0.0.1:{port}"
    env = {
        key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW__") and key != "AIRFLOW_HOME"
    }
    env.update({
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "SHIPLIFT_HOME": str(shiplift_home),
        # the triggerer imports _shiplift_triggers by classpath, and Airflow 3 puts no DAG folder on its sys.path
        "PYTHONPATH": os.pathsep.join(filter(None, (str(dags_folder), env.get("PYTHONPATH")))),
    })
    return env


def standalone_env(home: Path, *, port: int, dags_folder: Path, shiplift_home: Path) -> dict[str, str]:
    """`make airflow`: LocalExecutor on a SQLite metadata database inside AIRFLOW_HOME."""
    env = base_env(home, port=port, dags_folder=dags_folder, shiplift_home=shiplift_home)
    env.update({
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
    })
    return env


def celery_env(
    home: Path, *, port: int, dags_folder: Path, shiplift_home: Path, database_url: str, broker_url: str, queue: str
) -> dict[str, str]:
    """The production shape on one machine: CeleryExecutor, PostgreSQL metadata and results, Redis broker."""
    env = base_env(home, port=port, dags_folder=dags_folder, shiplift_home=shiplift_home)
    env.update({
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url,
        "AIRFLOW__CELERY__BROKER_URL": broker_url,
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + database_url,
        "AIRFLOW__OPERATORS__DEFAULT_QUEUE": queue,
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
        "AIRFLOW__CELERY__OPERATION_TIMEOUT": "10",
    })
    return env


def component_command(name: str, *, queue: str | None = None) -> list[str]:
    """The `airflow` command line of one component; log servers are skipped (the api-server reads local logs)."""
    airflow = str(BIN / "airflow")
    commands = {
        "api-server": [airflow, "api-server"],
        "scheduler": [airflow, "scheduler", "--skip-serve-logs"],
        "dag-processor": [airflow, "dag-processor"],
        "triggerer": [airflow, "triggerer", "--skip-serve-logs"],
        "celery-worker": [airflow, "celery", "worker", "--skip-serve-logs", "--concurrency", "2"]
        + (["--queues", queue] if queue else []),
    }
    if name not in commands:
        raise AirflowLocalError(f"unknown component {name!r}; use one of {', '.join(commands)}")
    return commands[name]


def migrate_db(env: dict[str, str], log_dir: Path, *, timeout_s: float = 300.0) -> float:
    """Create or upgrade the metadata database (`airflow db migrate`); returns the seconds it took."""
    log_dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with open(log_dir / "db-migrate.log", "wb") as log:
        try:
            done = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise AirflowLocalError(f"`airflow db migrate` did not finish in {timeout_s:.0f}s; "
                                    f"see {log_dir}/db-migrate.log") from exc
    if done.returncode != 0:
        raise AirflowLocalError(f"`airflow db migrate` failed (exit {done.returncode}):\n"
                                f"{log_tail(log_dir / 'db-migrate.log')}")
    return time.monotonic() - began


def log_tail(path: Path, lines: int = 30) -> str:
    """The last lines of a component log, for error messages."""
    if not path.is_file():
        return f"(no log at {path})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Supervisor:
    """Starts Airflow components in their own process groups, logs each to a file, and stops them all."""

    env: dict[str, str]
    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, command: list[str]) -> None:
        """Start one component (its own session, so stopping it also stops the processes it forks)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)

    def check_alive(self) -> None:
        """Fail with the component's log tail when one of them has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AirflowLocalError(f"{name} exited with {proc.returncode}:\n"
                                        f"{log_tail(self.log_dir / f'{name}.log')}")

    def stop(self, grace_s: float = STOP_GRACE_S) -> dict[str, int | None]:
        """SIGTERM every process group, SIGKILL whatever is left after the grace period; returns exit codes."""
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGKILL)  # stragglers the component forked (task runners, gunicorn children)
            if proc.poll() is None:
                proc.wait(timeout=10)
        codes = {name: proc.returncode for name, proc in self.procs.items()}
        self.procs.clear()
        return codes


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_for(what: str, probe: Callable[[], Any], *, deadline_s: float, interval_s: float = 0.5,
             alive: Callable[[], None] | None = None) -> Any:
    """Poll `probe` until it returns something truthy, or fail after `deadline_s` naming what never happened."""
    deadline = time.monotonic() + deadline_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if alive is not None:
            alive()
        try:
            value = probe()
            if value:
                return value
        except (OSError, AirflowLocalError, ValueError) as exc:
            last_error = exc
        time.sleep(interval_s)
    raise AirflowLocalError(f"{what} did not happen within {deadline_s:.0f}s"
                            + (f" (last error: {last_error})" if last_error else ""))


def admin_password(home: Path) -> str:
    """The admin password the simple auth manager generated into AIRFLOW_HOME on first start (stable after that)."""
    path = home / "simple_auth_manager_passwords.json.generated"
    if not path.is_file():
        raise AirflowLocalError(f"no generated password file at {path}; the api-server writes it when it first starts")
    passwords = json.loads(path.read_text())
    if ADMIN_USER not in passwords:
        raise AirflowLocalError(f"{path} has no password for {ADMIN_USER!r}; "
                                "delete the file and restart to regenerate it")
    return passwords[ADMIN_USER]


@dataclass
class AirflowApi:
    """A small client of the Airflow 3 REST API (`/api/v2`) with a bearer token from `/auth/token`."""

    base_url: str
    token: str | None = None

    def request(self, method: str, path: str, body: dict | None = None, *, auth: bool = True) -> Any:
        """One JSON request with a timeout; an HTTP error is raised with the server's answer."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            if not self.token:
                raise AirflowLocalError("no API token; call login() first")
            headers["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise AirflowLocalError(f"{method} {path} -> {exc.code}: {detail}") from exc

    def health(self) -> dict:
        """`/api/v2/monitor/health`: the status of the metadata DB, scheduler, dag-processor and triggerer."""
        return self.request("GET", "/api/v2/monitor/health", auth=False)

    def login(self, username: str, password: str) -> str:
        """Exchange the simple auth manager's username and password for a JWT."""
        answer = self.request("POST", "/auth/token", {"username": username, "password": password}, auth=False)
        self.token = answer["access_token"]
        return self.token

    def dag_ids(self) -> list[str]:
        """The ids of the DAGs the dag-processor has parsed and stored."""
        answer = self.request("GET", "/api/v2/dags?limit=1000")
        return sorted(dag["dag_id"] for dag in answer["dags"])

    def import_errors(self) -> list[dict]:
        """DAG files that failed to import, with their stack traces."""
        return self.request("GET", "/api/v2/importErrors?limit=100")["import_errors"]

    def unpause(self, dag_id: str) -> None:
        """Unpause a DAG (new DAGs start paused)."""
        self.request("PATCH", f"/api/v2/dags/{urllib.parse.quote(dag_id)}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        """Trigger a manual run now and return its run id."""
        answer = self.request("POST", f"/api/v2/dags/{urllib.parse.quote(dag_id)}/dagRuns",
                              {"logical_date": None, "conf": conf or {}})
        return answer["dag_run_id"]

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        """One DAG run (state, start/end dates)."""
        return self.request("GET", f"/api/v2/dags/{urllib.parse.quote(dag_id)}/dagRuns/{urllib.parse.quote(run_id)}")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        """The task instances of one run (state, queue, hostname, executor)."""
        dag, run = urllib.parse.quote(dag_id), urllib.parse.quote(run_id)
        answer = self.request("GET", f"/api/v2/dags/{dag}/dagRuns/{run}/taskInstances?limit=100")
        return answer["task_instances"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The log of one task try as the UI shows it (read from AIRFLOW_HOME/logs: no log server is needed)."""
        path = (f"/api/v2/dags/{urllib.parse.quote(dag_id)}/dagRuns/{urllib.parse.quote(run_id)}"
                f"/taskInstances/{urllib.parse.quote(task_id)}/logs/{try_number}?full_content=true")
        lines = self.request("GET", path)["content"]
        return "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)

    def wait_run(self, dag_id: str, run_id: str, *, deadline_s: float, alive: Callable[[], None] | None = None) -> dict:
        """Wait until a run reaches success or failed; fail after `deadline_s` with the task states so far. A poll
        that times out is polled again until the deadline: on two busy cores the api-server's one worker can take
        longer than a request's timeout to start a task instance, and answers nothing else meanwhile."""
        def finished() -> dict | None:
            run = self.dag_run(dag_id, run_id)
            return run if run["state"] in ("success", "failed") else None

        try:
            return wait_for(f"run {run_id} of {dag_id} finished", finished, deadline_s=deadline_s, interval_s=1.0,
                            alive=alive)
        except AirflowLocalError as exc:
            states = {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}
            raise AirflowLocalError(f"{exc}; tasks: {states}") from None


def components_healthy(api: AirflowApi, components: tuple[str, ...]) -> bool:
    """True when the metadata DB and every named component report healthy."""
    health = api.health()
    keys = {"scheduler": "scheduler", "dag-processor": "dag_processor", "triggerer": "triggerer"}
    wanted = ["metadatabase"] + [keys[c] for c in components if c in keys]
    return all((health.get(key) or {}).get("status") == "healthy" for key in wanted)


@dataclass
class LocalAirflow:
    """What `make airflow` starts: where it lives, its URL, and the timings of its start."""

    home: Path
    port: int
    dags_folder: Path
    shiplift_home: Path
    supervisor: Supervisor | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, deadline_s: float = 240.0) -> AirflowApi:
        """Migrate the SQLite database, start the four components, wait until healthy, and log in as admin."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.shiplift_home.mkdir(parents=True, exist_ok=True)
        env = standalone_env(self.home, port=self.port, dags_folder=self.dags_folder, shiplift_home=self.shiplift_home)
        began = time.monotonic()
        self.timings["db_migrate_s"] = round(migrate_db(env, self.home / "logs" / "components"), 1)
        self.supervisor = Supervisor(env, self.home / "logs" / "components")
        try:
            for name in LOCAL_COMPONENTS:
                self.supervisor.start(name, component_command(name))
            api = AirflowApi(self.base_url)
            wait_for("all components healthy", lambda: components_healthy(api, LOCAL_COMPONENTS),
                     deadline_s=deadline_s, alive=self.supervisor.check_alive)
            self.timings["healthy_s"] = round(time.monotonic() - began, 1)
            api.login(ADMIN_USER, admin_password(self.home))
        except BaseException:
            self.stop()
            raise
        return api

    def stop(self) -> dict[str, int | None]:
        """Stop every component; returns their exit codes."""
        if self.supervisor is None:
            return {}
        began = time.monotonic()
        codes = self.supervisor.stop()
        self.timings["stop_s"] = round(time.monotonic() - began, 1)
        return codes


def local_airflow(port: int | None = None) -> LocalAirflow:
    """The `make airflow` layout: .airflow, dags/, .shiplift/airflow; SHIPLIFT_AIRFLOW_HOME, SHIPLIFT_AIRFLOW_DAGS
    and SHIPLIFT_HOME override them."""
    home = Path(os.environ.get("SHIPLIFT_AIRFLOW_HOME", ROOT / ".airflow")).resolve()
    shiplift_home = Path(os.environ.get("SHIPLIFT_HOME", ROOT / ".shiplift" / "airflow")).resolve()
    dags_folder = Path(os.environ.get("SHIPLIFT_AIRFLOW_DAGS", ROOT / "dags")).resolve()
    return LocalAirflow(home=home, port=port or free_port(), dags_folder=dags_folder, shiplift_home=shiplift_home)


def _banner(airflow: LocalAirflow, dag_ids: list[str]) -> str:
    return "\n".join([
        "",
        f"Airflow is ready at {airflow.base_url}  (started in {airflow.timings['healthy_s']}s)",
        f"  log in as:  {ADMIN_USER}",
        f"  password:   {admin_password(airflow.home)}",
        f"              (generated once into {airflow.home}/simple_auth_manager_passwords.json.generated)",
        f"  DAGs:       {', '.join(dag_ids) or '(none parsed yet; the dag-processor rescans dags/ every 30s)'}",
        f"  SHIPLIFT_HOME={airflow.shiplift_home}",
        f"  component logs: {airflow.home}/logs/components/",
        "Press Ctrl-C to stop.",
        "",
    ])


def serve(port: int | None) -> int:
    """Foreground `make airflow`: start, print the login, and stop everything on Ctrl-C or SIGTERM."""
    airflow = local_airflow(port)
    print(f"starting Airflow in {airflow.home} on {airflow.base_url} ...", flush=True)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)  # also when started with SIGINT ignored (a background job)
    try:
        api = airflow.start()
        print(_banner(airflow, api.dag_ids()), flush=True)
        while True:
            airflow.supervisor.check_alive()
            time.sleep(2.0)
    except KeyboardInterrupt:
        print("stopping Airflow ...", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abandon components; stop() is bounded
        airflow.stop()
    print(f"stopped in {airflow.timings.get('stop_s')}s", flush=True)
    return 0


def check(port: int | None, *, expect: list[str], trigger: str | None, deadline_s: float) -> int:
    """Start, wait for health, list the DAGs via the REST API, optionally run one DAG, stop; print a JSON summary."""
    airflow = local_airflow(port)
    began = time.monotonic()
    api = airflow.start()
    summary: dict[str, Any] = {"base_url": airflow.base_url}
    try:
        wanted = set(expect) | ({trigger} if trigger else set())
        wait_for(f"DAGs {sorted(wanted)} parsed", lambda: wanted <= set(api.dag_ids()), deadline_s=deadline_s,
                 alive=airflow.supervisor.check_alive)
        summary["dags"] = api.dag_ids()
        summary["import_errors"] = [e["filename"] for e in api.import_errors()]
        airflow.timings["dags_listed_s"] = round(time.monotonic() - began, 1)
        if trigger:
            api.unpause(trigger)
            run_began = time.monotonic()
            run_id = api.trigger(trigger)
            run = api.wait_run(trigger, run_id, deadline_s=deadline_s, alive=airflow.supervisor.check_alive)
            airflow.timings["run_s"] = round(time.monotonic() - run_began, 1)
            summary["run"] = {"run_id": run_id, "state": run["state"],
                              "tasks": {ti["task_id"]: ti["state"] for ti in api.task_instances(trigger, run_id)}}
    finally:
        summary["exit_codes"] = airflow.stop()
        summary["timings"] = airflow.timings
        print(json.dumps(summary, indent=2))
    failed = summary["import_errors"] or (trigger and summary["run"]["state"] != "success")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """CLI: `standalone` (foreground, Ctrl-C stops) or `check` (start, list DAGs, stop)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("standalone", "check"):
        p = sub.add_parser(name)
        p.add_argument("--port", type=int, default=int(os.environ.get("AIRFLOW_PORT", "0")) or None,
                       help="api-server port on 127.0.0.1 (default: $AIRFLOW_PORT, else a free port)")
    sub.choices["check"].add_argument("--expect", action="append", default=[], help="a dag_id that must be listed")
    sub.choices["check"].add_argument("--trigger", help="a dag_id to unpause, trigger and wait for")
    sub.choices["check"].add_argument("--deadline", type=float, default=300.0,
                                      help="seconds to wait for DAGs, and for the run")
    args = parser.parse_args(argv)
    if args.command == "standalone":
        return serve(args.port)
    return check(args.port, expect=args.expect, trigger=args.trigger, deadline_s=args.deadline)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AirflowLocalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
