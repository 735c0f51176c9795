"""Per-component locks on a shared local endpoint (issue 44): while tenant x's rolling update is parked in a bake,
tenant y wakes from zero, scales, rolls out and rolls back at once, and healing the endpoint does not wait either;
two writers on one component still take turns. Real router, scaler and fake model-server processes on loopback.

The bake is a handshake: it says when it started and returns only when the test releases it, so it lasts as long as
each check runs. Before the fix every one of y's operations waited for the endpoint's lock, which the rollout held
through its bakes: y's commands are given a lock timeout of BOUND_S, so the old code fails them with Conflict, and the
wake-up (the router's scaler, which waits up to ten minutes) misses its BOUND_S deadline.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from shiplift.tasks.backends.interfaces import RolloutPlan, RolloutStep, ScaleToZeroPlan
from shiplift.tasks.backends.local.rollout import roll_out
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.errors import Conflict
from shiplift.validation.transport import NO_CAPACITY
from tests.unit.test_local_hosting import _spec

BOUND_S = 15.0  # far below a bake that only ends when released; a fake copy starts in well under a second
ENDPOINT = "ep-shared"
CANARY = RolloutPlan(strategy="canary")


class ParkedBake:
    """A bake that signals it started and returns (no alarm) only once released: a deadline keeps it from hanging."""

    def __init__(self) -> None:
        self.started, self.released = threading.Event(), threading.Event()

    def __call__(self, step: RolloutStep) -> str | None:
        self.started.set()
        if not self.released.wait(120):
            raise TimeoutError("the test never released the bake")
        return None


@contextmanager
def x_baking(state_dir) -> Iterator[ParkedBake]:
    """Tenant x's canary (its own command: a supervisor of its own, in a thread) parked in its first bake for the
    block; afterwards the bake is released and the rollout must end succeeded."""
    bake, outcome = ParkedBake(), {}

    def run() -> None:
        try:
            outcome["result"] = roll_out(ProcessSupervisor(state_dir), ENDPOINT, "x", _spec(copies=2, version="v2"),
                                         CANARY, bake, ready_timeout_s=20)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert bake.started.wait(30), f"x's rollout never reached its bake: {outcome}"
        yield bake
        assert thread.is_alive() and not bake.released.is_set(), "x was baking throughout"
    finally:
        bake.released.set()
        thread.join(60)
    assert outcome.get("result") is not None and outcome["result"].status == "succeeded", outcome


def _shared(hosting: ProcessSupervisor) -> str:
    """x (2 copies) and y (1 copy) on one endpoint; its URL."""
    url = hosting.ensure_endpoint(ENDPOINT).url
    hosting.put_component(ENDPOINT, "x", _spec(copies=2), ready_timeout_s=20)
    hosting.put_component(ENDPOINT, "y", _spec(copies=1), ready_timeout_s=20)
    return url


def _invoke(url: str, component: str) -> tuple[int, str]:
    request = urllib.request.Request(url + "/invocations", data=b'{"q": 1}', method="POST", headers={
        "Content-Type": "application/json", "X-Amzn-SageMaker-Inference-Component": component})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _wake(url: str, component: str, deadline_s: float) -> tuple[float, int]:
    """Seconds from the first request to the first answer of a component at zero copies, and the no-capacity
    answers meanwhile (each retried after 50 ms, as a client polls); fails past `deadline_s`."""
    start, refused = time.monotonic(), 0
    while time.monotonic() - start < deadline_s:
        status, body = _invoke(url, component)
        if status == 200:
            return time.monotonic() - start, refused
        assert status == 400 and NO_CAPACITY in json.loads(body)["Message"], (status, body)
        refused += 1
        time.sleep(0.05)
    pytest.fail(f"{component} did not wake within {deadline_s:g}s ({refused} no-capacity answers): it waited for "
                "another component's bake")


def _timed(call) -> float:
    start = time.monotonic()
    call()
    return time.monotonic() - start


def test_a_tenant_wakes_from_zero_while_another_tenant_bakes(hosting):
    url = _shared(hosting)
    hosting.set_scaling(ENDPOINT, "y", ScaleToZeroPlan(max_copies=1, idle_s=3600, invocations_per_copy=1))
    assert hosting.scale(ENDPOINT, "y", 0)
    with x_baking(hosting.state_dir):
        waited, refused = _wake(url, "y", BOUND_S)
    assert waited < BOUND_S and len(hosting._load(ENDPOINT).components["y"].copies) == 1
    print(f"y woke from zero in {waited:.2f}s while x baked ({refused} no-capacity answers meanwhile)")


def test_a_tenant_scales_and_the_endpoint_heals_while_another_tenant_bakes(hosting):
    _shared(hosting)
    other = ProcessSupervisor(hosting.state_dir, lock_timeout_s=BOUND_S)
    with x_baking(hosting.state_dir):
        assert _timed(lambda: other.scale(ENDPOINT, "y", 2)) < BOUND_S
        assert _timed(lambda: other.ensure_endpoint(ENDPOINT)) < BOUND_S
    assert len(hosting._load(ENDPOINT).components["y"].copies) == 2


def test_a_tenant_rolls_out_and_back_while_another_tenant_bakes(hosting):
    _shared(hosting)
    other = ProcessSupervisor(hosting.state_dir, lock_timeout_s=BOUND_S)
    before = [c.pid for c in hosting._load(ENDPOINT).components["y"].copies]
    with x_baking(hosting.state_dir):
        start = time.monotonic()
        result = roll_out(other, ENDPOINT, "y", _spec(copies=1, version="v2"), CANARY,
                          lambda step: "test alarm: error rate over 5%", ready_timeout_s=20)
        elapsed = time.monotonic() - start
    assert result.status == "rolled_back" and elapsed < BOUND_S
    y = hosting._load(ENDPOINT).components["y"]
    assert y.spec.model_ref["version"] == "v1" and y.previous is None and [c.pid for c in y.copies] != before
    x = hosting._load(ENDPOINT).components["x"]
    assert x.spec.model_ref["version"] == "v2" and len(x.copies) == 2, "x's rollout ended on its own copies"


def test_two_writers_on_one_component_take_turns(hosting):
    _shared(hosting)
    impatient = ProcessSupervisor(hosting.state_dir, lock_timeout_s=1)
    with x_baking(hosting.state_dir):
        before = [c.pid for c in hosting._load(ENDPOINT).components["x"].copies]
        with pytest.raises(Conflict, match="component x of endpoint ep-shared is being changed by another command"):
            impatient.scale(ENDPOINT, "x", 3)
        assert [c.pid for c in hosting._load(ENDPOINT).components["x"].copies] == before, "the rollout owns x's copies"
    assert impatient.scale(ENDPOINT, "x", 3), "once the rollout ended, the scaling runs"
