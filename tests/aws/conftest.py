"""Fixtures for tests against the AWS double (tests/fakes/aws_double.py): one server per session, reset per test."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

DOUBLE_MODULE = "shiplift_aws_double"


def _load_double():
    """tests/fakes/aws_double.py, loaded by path once (an installed distribution shadows the name `tests`)."""
    if DOUBLE_MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(DOUBLE_MODULE, Path(__file__).parents[1] / "fakes" / "aws_double.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[DOUBLE_MODULE] = module  # dataclasses look their module up while the file executes
        spec.loader.exec_module(module)
    return sys.modules[DOUBLE_MODULE]


@pytest.fixture(scope="session")
def aws_double_module():
    """The double's module (its constants and `AwsDouble`)."""
    return _load_double()


@pytest.fixture(scope="session")
def aws_double(aws_double_module):
    """One started double for the whole session; stopped (with every model server it started) at the end."""
    with aws_double_module.AwsDouble() as double:
        yield double


@pytest.fixture
def aws(aws_double, monkeypatch):
    """The session's double, reset, with this process's environment pointing boto3 at it (subprocesses inherit it)."""
    aws_double.reset()
    for name in list(os.environ):
        if name.startswith("AWS_"):  # a profile or a service-specific endpoint would win over AWS_ENDPOINT_URL
            monkeypatch.delenv(name)
    for name, value in aws_double.env().items():
        monkeypatch.setenv(name, value)
    yield aws_double


@pytest.fixture(scope="session")
def aws_release():
    """tests/aws/aws_release.py, loaded by path (the tiny aws config and the account it needs)."""
    spec = importlib.util.spec_from_file_location("shiplift_aws_release", Path(__file__).with_name("aws_release.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def aws_calls(monkeypatch):
    """Every request the product's `Aws.call` sends in this process, as (service, operation, params), in order."""
    from tasks.aws.session import Aws

    seen: list[tuple[str, str, dict]] = []
    send = Aws.call

    def spy(self, service, operation, **params):
        from tasks.aws.service_model import operation_name

        seen.append((service, operation_name(service, operation), params))
        return send(self, service, operation, **params)

    monkeypatch.setattr(Aws, "call", spy)
    return seen
