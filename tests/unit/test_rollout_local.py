"""Rolling updates on the local backend: real router and fake model-server processes, batch by batch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shiplift.tasks.backends.interfaces import RolloutPlan, RolloutStep
from shiplift.tasks.backends.local.rollout import roll_out
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.errors import NotFound
from tests.unit.conftest import _dead
from tests.unit.test_local_hosting import _invoke, _spec

LOAD_CLIENT = Path(__file__).resolve().parents[1] / "fakes" / "load_client.py"


class Watch:
    """A bake that records each step, what answered during it, and fires an alarm on request."""

    def __init__(self, hosting: ProcessSupervisor, endpoint: str, alarm_at: int | None = None,
                 crash_at: int | None = None):
        self.hosting, self.endpoint = hosting, endpoint
        self.alarm_at, self.crash_at = alarm_at, crash_at
        self.steps: list[RolloutStep] = []
        self.answered: list[set[int]] = []

    def __call__(self, step: RolloutStep) -> str | None:
        self.steps.append(step)
        url = self.hosting.endpoint_url(self.endpoint)
        self.answered.append({_invoke(url)[1]["pid"] for _ in range(8)})
        if self.crash_at == step.batch:
            raise KeyboardInterrupt("the pipeline was killed during the bake")
        return "test alarm: error rate over 5%" if self.alarm_at == step.batch else None


def _serving(hosting: ProcessSupervisor, endpoint: str, component: str) -> dict[str, list[int]]:
    """pids per model version of the copies the component runs now."""
    comp = hosting._load(endpoint).components[component]
    versions: dict[str, list[int]] = {}
    specs = {comp.spec_sha256: comp.spec}
    if comp.previous is not None:
        specs[comp.previous.sha256()] = comp.previous
    for copy in comp.copies:
        version = specs[copy.spec_sha256 or comp.spec_sha256].model_ref["version"]
        versions.setdefault(version, []).append(copy.pid)
    return versions


def _deploy(hosting: ProcessSupervisor, endpoint: str, copies: int = 2) -> list[int]:
    hosting.ensure_endpoint(endpoint)
    return [c.pid for c in hosting.put_component(endpoint, "semif", _spec(copies=copies), ready_timeout_s=20).copies]


def test_canary_moves_one_copy_bakes_then_the_rest(hosting):
    old = _deploy(hosting, "ep-canary")
    watch = Watch(hosting, "ep-canary")
    result = roll_out(hosting, "ep-canary", "semif", _spec(copies=2, version="v2"),
                      RolloutPlan(strategy="canary", batch_copies=1), watch, ready_timeout_s=20)
    assert result.status == "succeeded" and result.reason is None
    assert [(s.batch, s.batches, s.old_copies, s.new_copies) for s in result.steps] == [(1, 2, 1, 1), (2, 2, 0, 2)]
    serving = _serving(hosting, "ep-canary", "semif")
    assert list(serving) == ["v2"] and len(serving["v2"]) == 2
    assert len(watch.answered[0] & set(old)) == 1, "the canary bakes beside an old copy"
    assert len(watch.answered[0] - set(old)) == 1, "the canary bakes beside an old copy"
    assert watch.answered[1] == set(serving["v2"])
    assert all(_dead(pid) for pid in old)
    again = roll_out(hosting, "ep-canary", "semif", _spec(copies=2, version="v2"),
                     RolloutPlan(strategy="canary"), watch)
    assert again.status == "unchanged"


def test_linear_rolls_equal_batches(hosting):
    _deploy(hosting, "ep-linear", copies=3)
    result = roll_out(hosting, "ep-linear", "semif", _spec(copies=3, version="v2"),
                      RolloutPlan(strategy="linear", batch_copies=1), Watch(hosting, "ep-linear"), ready_timeout_s=20)
    assert [(s.old_copies, s.new_copies) for s in result.steps] == [(2, 1), (1, 2), (0, 3)]
    assert list(_serving(hosting, "ep-linear", "semif")) == ["v2"]


def test_an_alarm_rolls_back_batch_by_batch_and_the_old_spec_serves(hosting):
    old = _deploy(hosting, "ep-alarm", copies=3)
    result = roll_out(hosting, "ep-alarm", "semif", _spec(copies=3, version="v2"),
                      RolloutPlan(strategy="linear", batch_copies=1, rollback_batch_copies=1),
                      Watch(hosting, "ep-alarm", alarm_at=2), ready_timeout_s=20)
    assert result.status == "rolled_back" and result.reason == "test alarm: error rate over 5%"
    phases = [(s.phase, s.old_copies, s.new_copies, s.alarm is not None) for s in result.steps]
    assert phases == [("rollout", 2, 1, False), ("rollout", 1, 2, True), ("rollback", 2, 1, False),
                      ("rollback", 3, 0, False)]
    serving = _serving(hosting, "ep-alarm", "semif")
    assert list(serving) == ["v1"] and len(serving["v1"]) == 3
    assert set(serving["v1"]) & set(old) == {old[2]}, "the copy never replaced keeps serving"
    state = hosting._load("ep-alarm").components["semif"]
    assert state.previous is None and state.spec.model_ref["version"] == "v1"
    assert {_invoke(hosting.endpoint_url("ep-alarm"))[1]["pid"] for _ in range(9)} == set(serving["v1"])


def test_each_rollback_batch_is_told_while_it_serves(hosting):
    """A rollback in several batches tells each one as it is in rotation, not when the whole rollback has ended."""
    _deploy(hosting, "ep-told", copies=3)
    told: list[tuple[RolloutStep, dict[str, list[int]], set[int]]] = []

    def tell(step: RolloutStep) -> None:
        told.append((step, _serving(hosting, "ep-told", "semif"),
                     {_invoke(hosting.endpoint_url("ep-told"))[1]["pid"] for _ in range(9)}))

    result = roll_out(hosting, "ep-told", "semif", _spec(copies=3, version="v2"),
                      RolloutPlan(strategy="linear", batch_copies=1, rollback_batch_copies=1),
                      Watch(hosting, "ep-told", alarm_at=2), ready_timeout_s=20, on_rollback_step=tell)
    assert [step for step, _, _ in told] == [s for s in result.steps if s.phase == "rollback"]
    (first, at_first, answered_first), (second, at_second, answered_second) = told
    assert (first.batch, first.old_copies, first.new_copies) == (1, 2, 1)
    assert sorted(map(len, (at_first["v1"], at_first["v2"]))) == [1, 2], "batch 1 told while one new copy still serves"
    assert answered_first & set(at_first["v2"]), "the new copy still answered when batch 1 was told"
    assert list(at_second) == ["v1"] and answered_second == set(at_second["v1"])


def test_a_rollout_killed_mid_bake_resumes_where_it_stopped(hosting, tmp_path):
    old = _deploy(hosting, "ep-resume")
    with pytest.raises(KeyboardInterrupt):
        roll_out(hosting, "ep-resume", "semif", _spec(copies=2, version="v2"), RolloutPlan(strategy="canary"),
                 Watch(hosting, "ep-resume", crash_at=1), ready_timeout_s=20)
    half = _serving(hosting, "ep-resume", "semif")
    assert sorted(half) == ["v1", "v2"] and len(half["v1"]) == len(half["v2"]) == 1
    assert hosting._load("ep-resume").components["semif"].previous is not None
    rerun = ProcessSupervisor(tmp_path / "state")  # a new command, as after a crash
    watch = Watch(rerun, "ep-resume")
    result = roll_out(rerun, "ep-resume", "semif", _spec(copies=2, version="v2"), RolloutPlan(strategy="canary"), watch,
                      ready_timeout_s=20)
    assert result.status == "succeeded" and [s.batch for s in result.steps] == [2], "batch 1 is not redone"
    serving = _serving(rerun, "ep-resume", "semif")
    assert half["v2"][0] in serving["v2"] and len(serving["v2"]) == 2 and list(serving) == ["v2"]
    assert all(_dead(pid) for pid in old)


def test_a_rollout_to_another_spec_first_rolls_back_an_interrupted_one(hosting, tmp_path):
    _deploy(hosting, "ep-other")
    with pytest.raises(KeyboardInterrupt):
        roll_out(hosting, "ep-other", "semif", _spec(copies=2, version="v2"), RolloutPlan(strategy="canary"),
                 Watch(hosting, "ep-other", crash_at=1), ready_timeout_s=20)
    result = roll_out(ProcessSupervisor(tmp_path / "state"), "ep-other", "semif", _spec(copies=2, version="v3"),
                      RolloutPlan(strategy="canary"), Watch(hosting, "ep-other"), ready_timeout_s=20)
    assert result.status == "succeeded" and list(_serving(hosting, "ep-other", "semif")) == ["v3"]


def test_rolling_a_component_that_does_not_exist_is_not_found(hosting):
    hosting.ensure_endpoint("ep-none")
    with pytest.raises(NotFound, match="deploy it first"):
        roll_out(hosting, "ep-none", "semif", _spec(), RolloutPlan(strategy="canary"), Watch(hosting, "ep-none"))


def test_plan_targets():
    assert RolloutPlan(strategy="canary", batch_copies=1).targets(4) == [1, 4]
    assert RolloutPlan(strategy="linear", batch_copies=2).targets(5) == [2, 4, 5]
    assert RolloutPlan(strategy="all_at_once").targets(3) == [3]
    assert RolloutPlan(strategy="canary", batch_copies=9).targets(2) == [2]


def _roll_under_load(hosting: ProcessSupervisor, endpoint: str, clients: int, requests: int) -> dict:
    """A linear rollout of 3 copies (each answer takes 20 ms) while a second process sends the load; its counts."""
    hosting.ensure_endpoint(endpoint)
    old = {c.pid
           for c in hosting.put_component(endpoint, "semif", _spec(copies=3, FAKE_DELAY_S="0.02"),
                                          ready_timeout_s=20).copies}
    load = subprocess.Popen([sys.executable, str(LOAD_CLIENT), hosting.endpoint_url(endpoint), "--clients",
                             str(clients),
                             "--requests", str(requests), "--deadline-s", "300"], stdout=subprocess.PIPE, text=True)
    result = roll_out(hosting, endpoint, "semif", _spec(copies=3, version="v2", FAKE_DELAY_S="0.02"),
                      RolloutPlan(strategy="linear", batch_copies=1), lambda step: None, ready_timeout_s=20)
    out, _ = load.communicate(timeout=360)
    counts = json.loads(out)
    print(f"\nrolling update under load ({clients} clients): {counts}")
    assert result.status == "succeeded"
    assert counts["sent"] == requests and counts["other"] == 0, counts
    assert set(counts["by_status"]) <= {"200", "503"}, counts
    answered = {int(pid) for pid in counts["by_pid"]}
    assert answered & old and answered & set(_serving(hosting, endpoint,
                                                      "semif")["v2"]), "the load did not span the rollout"
    return counts


def test_a_rolling_update_under_load_from_another_process_loses_no_request(hosting):
    """Short variant (make test): 8 clients, 1,200 requests; `make test-load` runs 16 clients and 2,000."""
    _roll_under_load(hosting, "ep-load", clients=8, requests=1200)


@pytest.mark.load
def test_a_rolling_update_under_heavy_load_loses_no_request(hosting):
    _roll_under_load(hosting, "ep-heavy", clients=16, requests=2000)


def test_a_copy_killed_during_a_canary_is_replaced_and_the_rollout_ends_whole(hosting):
    import os
    import signal

    _deploy(hosting, "ep-kill")
    killed: list[int] = []

    def bake(step: RolloutStep) -> str | None:
        if step.batch == 1:  # the canary copy dies while it bakes; requests meanwhile go to the old copy
            canary = hosting._load("ep-kill").components["semif"].running(step.new_spec_sha256)[0]
            os.kill(canary.pid, signal.SIGKILL)
            assert _dead(canary.pid)
            killed.append(canary.pid)
            assert {_invoke(hosting.endpoint_url("ep-kill"))[0] for _ in range(4)} == {200}
        return None

    result = roll_out(hosting, "ep-kill", "semif", _spec(copies=2, version="v2"), RolloutPlan(strategy="canary"), bake,
                      ready_timeout_s=20)
    assert result.status == "succeeded"
    serving = _serving(hosting, "ep-kill", "semif")
    assert list(serving) == ["v2"] and len(serving["v2"]) == 2 and killed[0] not in serving["v2"]
    assert all(c["alive"] and c["ping"] == 200
               for c in hosting.describe_endpoint("ep-kill")["components"]["semif"]["copies"])


def _neutral(copies: int, version: str, **env: str):
    """A fake-copy spec that carries a neutral ComponentSpec, as the promote stage's specs do (metrics by spec need
    it)."""
    from shiplift.tasks.backends.interfaces import ComponentSpec, Compute, ModelRef

    digest = "sha256:" + (version.encode().hex() * 64)[:64]
    neutral = ComponentSpec(image_uri=f"fake/semif@{digest}", artifact_uri=f"file:///fake/{version}",
                            artifact_sha256="a" * 64,
                            environment=env, copies=copies, compute=Compute(memory_mb=128),
                            model_ref=ModelRef(release_id=version, artifact_sha256="a" * 64, image_digest=digest))
    return _spec(copies=copies, version=version,
                 **env).model_copy(update={"neutral": neutral.model_dump(mode="json")}), neutral


@pytest.mark.parametrize("fault, env, alarm", [
    ("answers 500", {"FAKE_STATUS": "500"}, "error rate"),
    ("answers slowly", {"FAKE_DELAY_S": "0.4"}, "latency p99"),
], ids=["500s", "slow"])
def test_a_faulty_canary_is_rolled_back_by_its_bake_alarm_under_live_traffic(hosting, fault, env, alarm):
    """The real bake (BakeWatch over the router's metrics of the new copies) with live traffic from a thread."""
    from types import SimpleNamespace

    from shiplift.tasks.backends.interfaces import BakeAlarms
    from shiplift.tasks.backends.local.hosting import LocalMetrics
    from shiplift.tasks.cli.demo import LiveTraffic
    from shiplift.tasks.pipeline.bake import BakeWatch

    endpoint = f"ep-fault-{'slow' if 'FAKE_DELAY_S' in env else '500'}"
    hosting.ensure_endpoint(endpoint)
    first, _ = _neutral(2, "v1")
    hosting.put_component(endpoint, "semif", first, ready_timeout_s=20)
    candidate, neutral = _neutral(2, "v2", **env)
    rules = BakeAlarms(max_error_rate=0.05, max_latency_p99_ms=200, min_invocations=3, check_interval_s=0.25)
    bake = BakeWatch(LocalMetrics(SimpleNamespace(processes=hosting)), endpoint, "semif", neutral.sha256(), rules, 20)
    with LiveTraffic(hosting.endpoint_url(endpoint), "semif", body=b'{"q": 1}', timeout_s=10) as traffic:
        result = roll_out(hosting, endpoint, "semif", candidate, RolloutPlan(strategy="canary", alarms=rules), bake,
                          ready_timeout_s=20)
    assert result.status == "rolled_back" and result.reason.startswith(alarm), (fault, result)
    assert [s.phase for s in result.steps] == ["rollout", "rollback"] and result.steps[0].new_copies == 1
    states = bake.evidence[result.steps[0].key()]["alarm_states"]
    assert states == {"error_rate": "ALARM" if alarm == "error rate" else "OK",
                      "latency_p99": "ALARM" if alarm == "latency p99" else "OK"}
    serving = _serving(hosting, endpoint, "semif")
    assert list(serving) == ["v1"] and len(serving["v1"]) == 2, "the champion's spec serves on every copy again"
    # 424: the model's 500
    assert traffic.statuses[200] > 0 and set(traffic.statuses) <= {200, 424, 503}, traffic.statuses
    assert (traffic.statuses[424] > 0) == (alarm == "error rate"), traffic.statuses
