"""Rollout strategies in the config, the plans they make, and the bake alarms that judge each batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from shiplift.tasks.backends.interfaces import ComponentMetrics, RolloutPlan, RolloutStep
from shiplift.tasks.config import BakeAlarms, load_release_config
from shiplift.tasks.errors import ConfigError, NotFound
from shiplift.tasks.pipeline.bake import BakeWatch, first_alarm, judge

GEMMA = Path(__file__).resolve().parents[2] / "configs" / "releases" / "gemma-decision.yaml"
STEP = RolloutStep(phase="rollout", batch=1, batches=2, old_copies=1, new_copies=1, old_spec_sha256="a" * 64,
                   new_spec_sha256="b" * 64)


def _rollout(*sets: str):
    return load_release_config(GEMMA, overrides=("rollout.copies=4", *sets)).rollout


def test_canary_and_linear_make_the_plans_their_parameters_say():
    canary = _rollout("rollout.strategy=canary", "rollout.wait_interval_s=120")
    assert canary.plan() == RolloutPlan(strategy="canary", batch_copies=1, wait_interval_s=120, max_execution_s=3600)
    assert canary.plan().targets(4) == [1, 4]
    linear = _rollout("rollout.strategy=linear", "rollout.batch.type=CAPACITY_PERCENT", "rollout.batch.value=50",
                      "rollout.rollback_batch.value=1", "rollout.maximum_execution_timeout_s=7200")
    assert linear.plan() == RolloutPlan(strategy="linear", batch_copies=2, wait_interval_s=300, rollback_batch_copies=1,
                                        max_execution_s=7200)
    assert linear.plan().targets(4) == [2, 4]
    assert _rollout("rollout.strategy=linear", "rollout.batch.type=CAPACITY_PERCENT", "rollout.batch.value=10").plan() \
        .batch_copies == 1, "a percentage rounds down to at least one copy"


@pytest.mark.parametrize("sets, words", [
    (("rollout.strategy=blue_green",), "blue_green is not offered.*InferenceComponentName.*use canary.*or linear"),
    (("rollout.strategy=canary", "rollout.batch.value=4"), "replaces them all at once"),
    (("rollout.strategy=linear", "rollout.batch.type=CAPACITY_PERCENT", "rollout.batch.value=101"), "at most 100"),
    (("rollout.strategy=canary", "rollout.batch.type=PERCENT"), "COPY_COUNT"),
    (("rollout.strategy=canary", "rollout.wait_interval_s=3601"), "wait_interval_s"),
    (("rollout.strategy=canary", "rollout.maximum_execution_timeout_s=599"), "maximum_execution_timeout_s"),
    (("rollout.strategy=canary", "rollout.alarms.max_error_rate=1.5"), "max_error_rate"),
    (("rollout.strategy=canary", "rollout.bake_s=300"), "bake_s"),
    (("rollout.strategy=canary", "rollout.online_gate.split=nope"),
     "split 'nope' is not a split any validation dataset keeps"),
    (("rollout.strategy=canary", "rollout.online_gate.max_tasks=5"),
     r"max_tasks \(5\) is below validation.champion.min_samples"),
])
def test_bad_rollouts_are_refused_with_the_field_and_the_reason(sets, words):
    with pytest.raises(ConfigError, match=words):
        _rollout(*sets)


def _metrics(invocations: int, errors: int, p99: float | None = None) -> ComponentMetrics:
    return ComponentMetrics(invocations=invocations, errors_4xx=0, errors_5xx=errors, model_errors=errors,
                            latency_p99_ms=p99)


def test_alarm_rules_against_reference_values():
    rules = BakeAlarms(max_error_rate=0.05, max_latency_p99_ms=250, min_invocations=20)
    assert first_alarm(judge(_metrics(19, 19), rules)) is None, "below the minimum there is no evidence yet"
    assert first_alarm(judge(_metrics(100, 5, 100.0), rules)) is None  # 5 % is at the limit, not over it
    fired = first_alarm(judge(_metrics(100, 6), rules))
    assert fired.startswith("error rate 0.060 (6 of 100") and "max_error_rate 0.05" in fired
    assert first_alarm(judge(_metrics(40, 0, 251.0),
                             rules)) == "latency p99 251.0 ms is over rollout.alarms.max_latency_p99_ms 250"
    assert first_alarm(judge(_metrics(40, 0, None), rules)) is None


class FakeMetrics:
    """Metrics of the new copies, a reading per call; NotFound until the copies have answered."""

    per_spec = True

    def __init__(self, readings):
        self.readings, self.calls = list(readings), []

    def component_metrics(self, endpoint, component, *, window_s, spec_sha256=None):
        self.calls.append((endpoint, component, spec_sha256))
        reading = self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        if reading is None:
            raise NotFound("no copy has answered yet", fix="wait")
        return reading


class Clock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_bake_watches_the_whole_wait_and_fires_at_the_first_alarm():
    rules = BakeAlarms(max_error_rate=0.05, min_invocations=10, check_interval_s=2)
    clock = Clock()
    quiet = FakeMetrics([None, _metrics(10, 0)])
    assert BakeWatch(quiet, "ep", "c", "s" * 64, rules, 5, sleep=clock.sleep, clock=lambda: clock.now)(STEP) is None
    assert clock.slept == [2, 2, 1] and quiet.calls[0] == ("ep", "c", "s" * 64)
    clock = Clock()
    noisy = FakeMetrics([_metrics(10, 0), _metrics(20, 5)])
    fired = BakeWatch(noisy, "ep", "c", "s" * 64, rules, 60, sleep=clock.sleep, clock=lambda: clock.now)(STEP)
    assert fired.startswith("error rate 0.250") and clock.slept == [2], "the alarm fires at the reading that shows it"


def test_an_online_gate_on_an_encoder_release_is_refused():
    nli = GEMMA.with_name("minilm-nli.yaml")
    with pytest.raises(ConfigError,
                       match=r"online_gate replays the gate.s tasks .*onnx releases \(nli gates\) cannot yet"):
        load_release_config(nli,
                            overrides=("rollout.strategy=canary", "rollout.copies=2", "rollout.online_gate.split=test"))
