"""One policy from the stage table, everywhere: for every step of a config with long deadlines, the retries and the
timeout the CLI, the Airflow refresh DAG and the rendered Step Functions state machine actually use are the table's
retries and `timeout_for(config)`; only errors whose `retryable` is true are retried, by all three."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tasks.config import load_release_config
from tasks.errors import (
    BadInput,
    CapacityError,
    ConfigError,
    Conflict,
    GateFailed,
    IntegrityError,
    LeaseHeld,
    LeaseLost,
    NotFound,
    NotReady,
    Throttled,
    error_classes,
    is_retryable,
)
from tasks.orchestrators.step_functions import STATE_NAMES, RunnerSettings, render_state_machine
from tasks.orchestrators.task_token import HEARTBEAT_TIMEOUT, error_name, retryable_error_names
from tasks.pipeline import release, table
from tasks.pipeline.table import MAX_STEP_TIMEOUT_S, STEPS, RetryBackoff, check_timeouts, timeout_for, timeouts_for

REPO = Path(__file__).resolve().parents[2]
RELEASES = REPO / "configs" / "releases"
RETRYABLE = (NotReady, CapacityError, Throttled)
NOT_RETRYABLE = (ConfigError, BadInput, IntegrityError, NotFound, Conflict, LeaseHeld, LeaseLost, GateFailed)
RUNNER = RunnerSettings(cluster="shiplift", task_definition="shiplift-pipeline:3",
                        pipeline_image="123456789012.dkr.ecr.us-east-1.amazonaws.com/p@sha256:" + "0" * 64,
                        subnets=["subnet-0123456789abcdef0"], startup_allowance_s=600)


@pytest.fixture(scope="module")
def long_config_file(tmp_path_factory) -> Path:
    """The qwen example with every deadline long: an 8 h image build, 3 h scoring runs, an 8 h rolling update."""
    path = tmp_path_factory.mktemp("long") / "qwen-long.yaml"
    path.write_text(
        f"extends: {RELEASES / 'qwen35-4b-semif.yaml'}\n"
        "backend: {kind: aws, build_timeout_s: 28800}\n"
        "validation: {deadline_s: 10800.0}\n"
        "rollout: {strategy: linear, copies: 2, maximum_execution_timeout_s: 28800}\n",
        encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def long_config(long_config_file):
    return load_release_config(long_config_file)


def test_the_long_config_needs_more_than_the_table_where_its_deadlines_say(long_config):
    needed = timeouts_for(long_config)
    assert needed["image"] == 28800 + table.STAGE_MARGIN_S > STEPS["image"].timeout_s
    assert needed["validate"] == 10800 * 2 * len(long_config.validation.datasets) + table.STAGE_MARGIN_S
    assert needed["build"] == 10800 + 3600 + table.STAGE_MARGIN_S  # it fits a temperature
    assert needed["promote"] == 28800 + table.DEPLOY_WAIT_S + table.STAGE_MARGIN_S
    assert needed["resolve"] == STEPS["resolve"].timeout_s  # no deadline of its own in the config
    assert all(seconds <= MAX_STEP_TIMEOUT_S for seconds in needed.values())


def test_only_errors_that_say_retryable_are_retryable():
    assert all(is_retryable(cls("x")) for cls in RETRYABLE)
    assert not any(is_retryable(cls("x")) for cls in NOT_RETRYABLE)
    assert not is_retryable(RuntimeError("a bug")) and not is_retryable(OSError("disk"))
    assert {cls for cls in error_classes() if cls.retryable} == {NotReady, CapacityError, Throttled}
    assert retryable_error_names() == ["Shiplift." + cls.__name__ for cls in error_classes() if cls.retryable]
    assert error_name(ConfigError("x")) == "Shiplift.ConfigError" and error_name(KeyError("x")) == "Shiplift.UnexpectedError"


def _airflow_policy(config_file: Path) -> dict[str, dict]:
    sys.path.insert(0, str(REPO / "dags"))
    try:
        import _shiplift_dags
    finally:
        sys.path.remove(str(REPO / "dags"))
    dag = _shiplift_dags.refresh_dag(str(config_file))
    policy = {}
    for name in STEPS:
        task = dag.get_task(name)
        decide = task.retry_policy.evaluate
        policy[name] = {
            "retries": task.retries,
            "timeout_s": int(task.execution_timeout.total_seconds()),
            "retried": sorted(cls.__name__ for cls in (*RETRYABLE, *NOT_RETRYABLE, RuntimeError)
                              if decide(cls("x"), 1, task.retries + 1).action.value == "retry"),
        }
    return policy


def _step_functions_policy(config) -> dict[str, dict]:
    definition = render_state_machine(config, runner=RUNNER, config_path="configs/releases/qwen-long.yaml")
    states = definition["States"]
    named = {"begin": "Begin", "end": "EndSucceeded", **STATE_NAMES}
    policy = {}
    for name, state_name in named.items():
        state = states[state_name]
        rules = [r for r in state["Retry"] if HEARTBEAT_TIMEOUT in r["ErrorEquals"]]
        policy[name] = {
            "retries": rules[0]["MaxAttempts"] if rules else 0,
            "timeout_s": state["TimeoutSeconds"] - RUNNER.startup_allowance_s,  # the ECS start-up, added once
            "retried": sorted(e.removeprefix("Shiplift.") for r in rules for e in r["ErrorEquals"] if e.startswith("Shiplift.")),
        }
        assert state["HeartbeatSeconds"] < state["TimeoutSeconds"], state_name
    return policy


def _cli_policy(monkeypatch, config) -> dict[str, dict]:
    """What `shiplift release` does: count the attempts `ensure_stage_retrying` makes of each stage per error."""
    monkeypatch.setattr(table, "BACKOFF", RetryBackoff(first_s=0.0, factor=1.0, max_s=0.0))
    attempts: list[str] = []

    def failing(ctx, name):
        attempts.append(name)
        raise ctx.error("x")

    monkeypatch.setattr(release, "ensure_stage", failing)
    policy = {}
    for name in table.STAGE_NAMES:
        tried = []
        for cls in (*RETRYABLE, *NOT_RETRYABLE, RuntimeError):
            attempts.clear()
            ctx = type("Ctx", (), {"error": cls, "say": staticmethod(lambda message: None)})()
            with pytest.raises(cls):
                release.ensure_stage_retrying(ctx, name)
            if len(attempts) > 1:
                tried.append((cls.__name__, len(attempts) - 1))
        retries = {count for _, count in tried}
        assert len(retries) <= 1, f"{name}: the CLI retries different errors a different number of times: {tried}"
        policy[name] = {"retries": retries.pop() if retries else 0, "timeout_s": timeout_for(name, config),
                        "retried": sorted(n for n, _ in tried)}
    return policy


def test_cli_airflow_and_step_functions_use_one_policy_per_step(monkeypatch, long_config_file, long_config):
    airflow = _airflow_policy(long_config_file)
    step_functions = _step_functions_policy(long_config)
    cli = _cli_policy(monkeypatch, long_config)
    retryable = sorted(cls.__name__ for cls in RETRYABLE)
    for name, step in STEPS.items():
        expected = {"retries": step.retries, "timeout_s": timeout_for(name, long_config),
                    "retried": retryable if step.retries else []}
        assert airflow[name] == expected, f"airflow {name}"
        assert step_functions[name] == expected, f"step functions {name}"
        if name in cli:  # the CLI runs the stages; begin and end are the orchestrators' own steps
            assert cli[name] == expected, f"cli {name}"


def test_a_config_whose_deadlines_exceed_the_orchestrator_is_refused_with_the_fix(long_config):
    too_long = long_config.model_copy(update={"validation": long_config.validation.model_copy(update={"deadline_s": 50000.0})})
    with pytest.raises(ConfigError) as refused:
        check_timeouts(too_long)
    assert "validate needs" in refused.value.problem and "validation.deadline_s" in refused.value.fix
    with pytest.raises(ConfigError):
        render_state_machine(too_long, runner=RUNNER, config_path="configs/releases/qwen-long.yaml")
    # The timeouts an orchestrator was set up with bound a run too: a DAG parsed from the short config, run with
    # overrides that lengthen the deadlines, is refused at begin.
    check_timeouts(long_config, timeouts_for(long_config))
    shorter = {**timeouts_for(long_config), "image": STEPS["image"].timeout_s}
    with pytest.raises(ConfigError) as refused:
        check_timeouts(long_config, shorter)
    assert f"image needs {28800 + table.STAGE_MARGIN_S} s, the orchestrator allows {STEPS['image'].timeout_s} s" in refused.value.problem


def test_begin_refuses_a_config_that_outgrew_the_orchestrator_before_anything_is_opened(tmp_path):
    from tasks.ledger.store import Ledger
    from tasks.pipeline.release import begin_orchestrated
    from tests.tiny_release import write_tiny_config

    config = write_tiny_config(tmp_path / "configs", tmp_path / "state")
    allowed = {**timeouts_for(load_release_config(config)), "validate": STEPS["validate"].timeout_s}
    with pytest.raises(ConfigError, match="validate needs"):
        begin_orchestrated(config, holder="test", allowed_timeouts=allowed, overrides=("validation.deadline_s=7200.0",),
                           progress=lambda message: None)
    ledger_file = tmp_path / "state" / "ledger.db"
    assert not ledger_file.exists() or Ledger(f"sqlite:///{ledger_file}").history() == [], "nothing was opened"
