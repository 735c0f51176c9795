"""Serverless placement on the local backend (docs/fleet.md, "Serverless"; issue 36, item 4): the router emulates
SageMaker Serverless Inference (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html). A request
that finds no compute waits for the copy it starts and is answered (a cold start, not an error); requests beyond
MaxConcurrency are throttled with ThrottlingException, which every client retries; idle compute goes unless provisioned
concurrency keeps it. Real router, real scaler processes, fake model servers on loopback."""

from __future__ import annotations

import threading
import time

import pytest

from shiplift.tasks.backends.interfaces import ScaleToZeroPlan
from shiplift.tasks.backends.local.endpoint_state import ServerlessEmulation
from shiplift.tasks.backends.local.router_admin_payload import scaling_problem as _scaling_problem
from shiplift.tasks.backends.placement import MemoryEstimate, ServerlessPlacement, fit_problem
from shiplift.validation.transport import RUNTIME_RETRYABLE
from tests.unit.conftest import _dead
from tests.unit.test_local_hosting import _spec, _wait_for
from tests.unit.test_scale_to_zero_local import _copies, _invoke_runtime

IDLE = ScaleToZeroPlan(max_copies=1, idle_s=1, invocations_per_copy=1)


def _serverless(hosting, endpoint: str, *, max_concurrency: int = 4, warm: bool = False, **env: str):
    """A component registered as serverless, scaled to no compute (unless warm); its endpoint's runtime URL."""
    info = hosting.ensure_endpoint(endpoint)
    hosting.put_component(endpoint, "encoder", _spec(copies=1, **env), ready_timeout_s=20)
    hosting.set_scaling(endpoint, "encoder", IDLE,
                        ServerlessEmulation(hold_s=30, max_concurrency=max_concurrency, warm=warm))
    if not warm:
        hosting.scale(endpoint, "encoder", 0)
    return info.url


def test_a_request_that_finds_no_compute_waits_for_its_cold_start_and_is_answered(hosting):
    url = _serverless(hosting, "ep-sls-cold", FAKE_STARTUP_DELAY_S="0.5")
    assert _copies(hosting, "ep-sls-cold", "encoder") == []
    started = time.monotonic()
    status, _ = _invoke_runtime(url, "encoder")
    assert status == 200, "held through the start, not refused"
    assert time.monotonic() - started >= 0.5, "the answer waited for the copy's start"
    assert len(_copies(hosting, "ep-sls-cold", "encoder")) == 1
    counters = hosting.metrics("ep-sls-cold")["components"]["encoder"]
    assert counters["no_capacity_invocation_failures"] == 0 and counters["invocations"] == 1

    # idle for idle_s: the compute goes again, and the endpoint keeps answering through the next cold start
    first = _copies(hosting, "ep-sls-cold", "encoder")[0].pid
    _wait_for(lambda: not _copies(hosting, "ep-sls-cold", "encoder") and _dead(first), 20, "idle compute given back")
    assert _invoke_runtime(url, "encoder")[0] == 200


def test_requests_beyond_max_concurrency_are_throttled_and_retryable(hosting):
    url = _serverless(hosting, "ep-sls-busy", max_concurrency=1, warm=True, FAKE_DELAY_S="1.5")
    answers: list[int] = []
    slow = threading.Thread(target=lambda: answers.append(_invoke_runtime(url, "encoder")[0]))
    slow.start()
    _wait_for(lambda: hosting._admin(hosting._load("ep-sls-busy"), "GET",
                                     "state")[1]["components"]["encoder"]["copies"][0]
              ["outstanding"] == 1, 10, "the first request in flight")
    status, body = _invoke_runtime(url, "encoder")
    slow.join(timeout=20)
    assert answers == [200]
    assert status == 429 and body["error_type"] == "ThrottlingException" and "MaxConcurrency of 1" in body["Message"]
    assert "ThrottlingException" in RUNTIME_RETRYABLE, "the runtime clients retry it"
    assert _invoke_runtime(url, "encoder")[0] == 200, "a slot is free again once the first is answered"


def test_provisioned_concurrency_keeps_the_compute_warm(hosting):
    _serverless(hosting, "ep-sls-warm", warm=True)
    [warm_copy] = _copies(hosting, "ep-sls-warm", "encoder")
    # a cold twin on the same router, idle as long: once the router's idle check has taken its copy, it has judged
    # the warm one too
    hosting.put_component("ep-sls-warm", "cold", _spec(copies=1), ready_timeout_s=20)
    hosting.set_scaling("ep-sls-warm", "cold", IDLE, ServerlessEmulation(hold_s=30, max_concurrency=4, warm=False))
    _wait_for(lambda: not _copies(hosting, "ep-sls-warm", "cold"), 20, "the cold twin's idle scale-in")
    assert _copies(hosting, "ep-sls-warm", "encoder") == [warm_copy]


@pytest.mark.parametrize("registration, problem", [
    ({"idle_s": 1, "hold_s": 5, "max_concurrency": 0, "warm": False}, "max_concurrency"),
    ({"idle_s": 1, "hold_s": 5, "max_concurrency": 2}, "scale_to_zero must be"),
    ({"idle_s": 1, "hold_s": 5, "max_concurrency": 2, "warm": "no"}, "boolean"),
])
def test_the_router_refuses_a_malformed_serverless_registration(registration, problem):
    assert problem in _scaling_problem(registration)
    assert _scaling_problem({"idle_s": 1, "hold_s": 5, "max_concurrency": 2, "warm": True}) is None


def test_the_model_must_fit_the_serverless_memory_size():
    placement = ServerlessPlacement(kind="serverless", memory_size_mb=1024, max_concurrency=2, max_cold_start_p95_s=60)
    small = MemoryEstimate(weights_mb=90, context_mb=20, runtime_mb=512, context_label="activations")
    assert fit_problem(small, placement) is None
    big = MemoryEstimate(weights_mb=900, context_mb=400, runtime_mb=512, context_label="activations")
    assert "set placement.memory_size_mb: 2048" in fit_problem(big, placement)
    huge = MemoryEstimate(weights_mb=7000, context_mb=0, runtime_mb=512)
    assert "at most 6144 MB, so use an instance placement" in fit_problem(huge, placement)
