"""Scale to zero on the local backend: the router stops an idle component's copies through the scaler and starts one
when a request finds none, answering that request with SageMaker's retryable no-capacity error (real router, real
scaler processes, fake model servers on loopback)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from shiplift.tasks.backends.interfaces import ScaleToZeroPlan
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.errors import BadInput, NotFound
from shiplift.validation.cold_start import first_answer
from shiplift.validation.transport import NO_CAPACITY, HttpInvoker
from tests.unit.conftest import _dead
from tests.unit.test_local_hosting import _router_ping, _spec, _wait_for


def _invoke_runtime(url: str, component: str) -> tuple[int, dict]:
    """One InvokeEndpoint-shaped request to the router, as botocore's sagemaker-runtime client sends it."""
    request = urllib.request.Request(url + "/invocations", data=b'{"q": 1}', method="POST", headers={
        "Content-Type": "application/json", "X-Amzn-SageMaker-Inference-Component": component})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, {**json.loads(error.read()), "error_type": error.headers.get("x-amzn-ErrorType")}


def _copies(hosting: ProcessSupervisor, endpoint: str, component: str) -> list:
    return hosting._load(endpoint).components[component].copies


def test_an_idle_component_loses_its_copies_and_the_first_request_brings_one_back(hosting):
    info = hosting.ensure_endpoint("ep-zero")
    hosting.put_component("ep-zero", "semif", _spec(copies=1), ready_timeout_s=20)
    first_pid = _copies(hosting, "ep-zero", "semif")[0].pid
    assert hosting.set_scaling("ep-zero", "semif", ScaleToZeroPlan(max_copies=1, idle_s=1, invocations_per_copy=1))
    assert not hosting.set_scaling("ep-zero", "semif", ScaleToZeroPlan(max_copies=1, idle_s=1, invocations_per_copy=1))

    # idle for idle_s: the router runs the scaler, which drains and stops the copy
    _wait_for(lambda: not _copies(hosting, "ep-zero", "semif") and _dead(first_pid), 20, "scale in to zero")
    assert _router_ping(hosting, "ep-zero")[0] == 200, "a component scaled to zero is not an unhealthy endpoint"
    listed = {e["name"]: e for e in hosting.list_endpoints()}["ep-zero"]
    assert listed["status"] == "ok" and listed["components"]["semif"]["copies"] == 0
    hosting.ensure_endpoint("ep-zero")  # healing leaves a component scaled to zero alone
    assert _copies(hosting, "ep-zero", "semif") == []

    # the first request finds no copy: SageMaker's no-capacity ValidationError, counted, and a copy starts
    status, body = _invoke_runtime(info.url, "semif")
    assert status == 400 and body["error_type"] == "ValidationError" and NO_CAPACITY in body["Message"]
    assert hosting.metrics("ep-zero")["components"]["semif"]["no_capacity_invocation_failures"] >= 1

    # retried as the eval runners retry it, the request is answered once the copy is up: nothing is lost
    start = first_answer(HttpInvoker(info.url, "semif", runtime=True), b'{"q": 1}', timeout_s=10, deadline_s=30)
    assert start.error is None and start.attempts >= 1
    copies = _copies(hosting, "ep-zero", "semif")
    assert len(copies) == 1 and copies[0].pid != first_pid
    assert _invoke_runtime(info.url, "semif")[0] == 200


def test_scale_sets_the_copies_now_and_healing_keeps_that_count(hosting):
    hosting.ensure_endpoint("ep-scale")
    hosting.put_component("ep-scale", "semif", _spec(copies=1), ready_timeout_s=20)
    old = _copies(hosting, "ep-scale", "semif")[0]
    assert hosting.scale("ep-scale", "semif", 2)
    assert len(_copies(hosting, "ep-scale", "semif")) == 2 and old in _copies(hosting, "ep-scale", "semif")
    assert not hosting.scale("ep-scale", "semif", 2)
    with pytest.raises(BadInput, match="does not scale to zero"):
        hosting.scale("ep-scale", "semif", 0)
    assert len(_copies(hosting, "ep-scale", "semif")) == 2, "a refused scale changes nothing"
    hosting.set_scaling("ep-scale", "semif", ScaleToZeroPlan(max_copies=2, idle_s=3600, invocations_per_copy=1))
    assert hosting.scale("ep-scale", "semif", 0)
    assert _copies(hosting, "ep-scale", "semif") == [] and _dead(old.pid)
    hosting.ensure_endpoint("ep-scale")
    assert _copies(hosting, "ep-scale", "semif") == [], "the spec's one copy is not started again by healing"
    with pytest.raises(BadInput, match="0..64"):
        hosting.scale("ep-scale", "semif", -1)
    with pytest.raises(NotFound, match="absent"):
        hosting.scale("ep-scale", "absent", 1)


def test_a_scaler_that_lost_the_race_with_a_teardown_starts_nothing(tmp_path):
    state = tmp_path / "state"
    ProcessSupervisor(state)  # the folders only: the endpoint was deleted before the scaler ran
    done = subprocess.run([sys.executable, "-m", "shiplift.tasks.backends.local.scaler", "--state-dir", str(state),
                           "ep-gone",
                           "semif", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "does not exist" in done.stderr
    assert list((state / "endpoints").iterdir()) == [], "no endpoint state was created"
