"""Fixtures shared by every suite."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Whole releases on the local backend and the AWS double, and Airflow's dag.test() runs: `make test-integration`
# (which `.ci/run` runs after `make test`), so that `make test` stays under 20 minutes.
INTEGRATION_SUITES = ("e2e", "aws", "dags")


def pytest_collection_modifyitems(items):
    """Mark every test of the integration suites `integration` (pyproject.toml's markers)."""
    suites = {TESTS / name for name in INTEGRATION_SUITES}
    for item in items:
        if suites & set(Path(item.path).resolve().parents):
            item.add_marker(pytest.mark.integration)


def load_by_path(name: str, path: Path):
    """A test helper module loaded by path, once: an installed distribution (smdebug_rulesconfig) shadows the name
    `tests`."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file executes
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session", autouse=True)
def checkpoint_key(tmp_path_factory):
    """One checkpoint signing key for the session, outside every state dir (and out of the user's home);
    subprocesses (Airflow tasks, the CLI) inherit it through the environment."""
    import os

    path = tmp_path_factory.mktemp("keys") / "ledger-ed25519.pem"
    previous = os.environ.get("SHIPLIFT_CHECKPOINT_KEY")
    os.environ["SHIPLIFT_CHECKPOINT_KEY"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("SHIPLIFT_CHECKPOINT_KEY", None)
    else:
        os.environ["SHIPLIFT_CHECKPOINT_KEY"] = previous


@pytest.fixture(scope="session", autouse=True)
def stop_local_endpoints_left_serving(tmp_path_factory):
    """A release leaves its production endpoint serving, as it should; at the session's end every local endpoint
    under pytest's temporary folders is stopped, so a test run leaves no router or model server behind."""
    yield
    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor

    for endpoints in sorted(tmp_path_factory.getbasetemp().rglob("endpoints")):
        if endpoints.is_dir() and any(endpoints.glob("*.json")):
            hosting = ProcessSupervisor(endpoints.parent)
            for endpoint in hosting.list_endpoints():
                hosting.delete_endpoint(endpoint["name"])


@pytest.fixture(scope="session")
def tiny_release():
    """tests/tiny_release.py: the fast tiny-model release config of the local backend."""
    return load_by_path("shiplift_tiny_release", TESTS / "tiny_release.py")


@pytest.fixture(scope="session")
def server_modules():
    """The image servers imported in this process, by image name (`semif`, `encoder`), for their start-up checks."""
    images = TESTS.parent / "images"
    return {name: load_by_path(f"shiplift_{name}_server", images / name / "server.py") for name in ("semif", "encoder")}


@pytest.fixture(scope="session")
def aws_release():
    """tests/aws/aws_release.py: the tiny release config of the aws backend and the account it needs."""
    return load_by_path("shiplift_aws_release", TESTS / "aws" / "aws_release.py")


@pytest.fixture(scope="session")
def aws_double_module():
    """tests/fakes/aws_double.py (its constants and `AwsDouble`)."""
    return load_by_path("shiplift_aws_double", TESTS / "fakes" / "aws_double.py")


@pytest.fixture(scope="session")
def aws_double(aws_double_module):
    """One started AWS double for the whole session; stopped (with every model server it started) at the end."""
    with aws_double_module.AwsDouble() as double:
        yield double


@pytest.fixture
def aws(aws_double, monkeypatch):
    """The session's double, reset, with this process's environment pointing boto3 at it (subprocesses inherit it)."""
    import os

    aws_double.reset()
    for name in list(os.environ):
        if name.startswith("AWS_"):  # a profile or a service-specific endpoint would win over AWS_ENDPOINT_URL
            monkeypatch.delenv(name)
    for name, value in aws_double.env().items():
        monkeypatch.setenv(name, value)
    yield aws_double


@pytest.fixture
def aws_calls(monkeypatch):
    """Every request the product's `Aws.call` sends in this process, as (service, operation, params), in order."""
    from shiplift.tasks.backends.aws.service_model import operation_name
    from shiplift.tasks.backends.aws.session import Aws

    seen: list[tuple[str, str, dict]] = []
    send = Aws.call

    def spy(self, service, operation, **params):
        seen.append((service, operation_name(service, operation), params))
        return send(self, service, operation, **params)

    monkeypatch.setattr(Aws, "call", spy)
    return seen
