"""One policy from the policy table, everywhere: for every step of a config with long deadlines and an approval, the
retries, backoff, timeout and deferral (how often a deferred stage is polled) the Airflow DAGs and the rendered Step
Functions state machine set up are the table's and `timeout_for(config)`, and the CLI runs each step through
`table.attempts` (retries, backoff, per-attempt timeout); only errors whose `retryable` is true are retried, by all
three."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import (
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
    StepTimedOut,
    Throttled,
    error_classes,
    is_retryable,
)
from shiplift.tasks.orchestrators.step_functions import (
    APPROVAL_STATE,
    APPROVAL_TIMED_OUT_STATE,
    ECS_INFRA_ERRORS,
    STATE_NAMES,
    RunnerSettings,
    render_state_machine,
)
from shiplift.tasks.orchestrators.task_token import HEARTBEAT_TIMEOUT, error_name, retryable_error_names
from shiplift.tasks.pipeline import table
from shiplift.tasks.pipeline.table import MAX_STEP_TIMEOUT_S, STEPS, check_timeouts, timeout_for, timeouts_for

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


@pytest.fixture(scope="module")
def long_approval_file(long_config_file) -> Path:
    """The long config, its promotion waiting up to 10 days for a person."""
    path = long_config_file.parent / "qwen-long-approval.yaml"
    path.write_text(f"extends: {long_config_file}\n"
                    "promotion: {approval: {required: true, approvers: [alice], timeout_s: 864000}}\n",
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def long_approval(long_approval_file):
    return load_release_config(long_approval_file)


def test_the_long_config_needs_more_than_the_table_where_its_deadlines_say(long_config):
    needed = timeouts_for(long_config)
    assert needed["image"] == 28800 + table.STAGE_MARGIN_S > STEPS["image"].timeout_s
    assert needed["validate"] == 10800 * 2 * len(long_config.validation.datasets) + table.STAGE_MARGIN_S
    assert needed["build"] == 10800 + 3600 + table.STAGE_MARGIN_S  # it fits a temperature
    assert needed["promote"] == 28800 + table.DEPLOY_WAIT_S + table.STAGE_MARGIN_S
    assert needed["resolve"] == STEPS["resolve"].timeout_s  # no deadline of its own in the config
    assert all(seconds <= MAX_STEP_TIMEOUT_S for name, seconds in needed.items() if not STEPS[name].person)
    assert needed["approval"] == long_config.promotion.approval.timeout_s, "a person's wait: the config's own"


def test_only_errors_that_say_retryable_are_retryable():
    assert all(is_retryable(cls("x")) for cls in RETRYABLE)
    assert not any(is_retryable(cls("x")) for cls in NOT_RETRYABLE)
    assert not is_retryable(RuntimeError("a bug")) and not is_retryable(OSError("disk"))
    assert {cls for cls in error_classes() if cls.retryable} == {NotReady, CapacityError, Throttled}
    assert retryable_error_names() == ["Shiplift." + cls.__name__ for cls in error_classes() if cls.retryable]
    assert error_name(ConfigError("x")) == "Shiplift.ConfigError"
    assert error_name(KeyError("x")) == "Shiplift.UnexpectedError"


def _load_dags():
    sys.path.insert(0, str(REPO / "dags"))
    try:
        import _shiplift_dags
    finally:
        sys.path.remove(str(REPO / "dags"))
    return _shiplift_dags


def _airflow_policy(config_file: Path) -> dict[str, dict]:
    """What the Airflow DAGs set, per step: the refresh DAG of `config_file` (its release steps), the promote_release
    DAG (a triggered promotion, a rollback) and the audit DAG."""
    dags = _load_dags()
    refresh, promote, audit = dags.refresh_dag(str(config_file)), dags.promote_release_dag(), dags.audit_ledger_dag()
    tasks = {**{name: refresh.get_task(name) for name in table.RELEASE_STEPS},
             "promote_release": promote.get_task("promote"), "rollback": promote.get_task("rollback"),
             "audit": audit.get_task("audit")}
    policy = {}
    for name, task in tasks.items():
        waits = isinstance(task, dags.ShipliftApproval)
        seen = {"retries": task.retries,
                "timeout_s": int((task.response_timeout if waits else task.execution_timeout).total_seconds()),
                "defers": getattr(task, "poll_every_s", None)}  # a DeferredStage's trigger polls this often
        if task.retries:
            decide = task.retry_policy.evaluate
            seen["retried"] = sorted(cls.__name__ for cls in (*RETRYABLE, *NOT_RETRYABLE, RuntimeError)
                                     if decide(cls("x"), 1, task.retries + 1).action.value == "retry")
            seen["backoff"] = (task.retry_delay.total_seconds(), float(task.retry_exponential_backoff),
                               task.max_retry_delay.total_seconds())
        policy[name] = seen
    for name in ("approval_request", "approval_decision"):  # the promote_release DAG's own approval steps
        assert promote.get_task(name).retries == STEPS[name].retries, name
        assert promote.get_task(name).execution_timeout.total_seconds() == STEPS[name].timeout_s, name
    return policy


def _step_functions_policy(config) -> dict[str, dict]:
    """What the rendered state machine sets, per step: each Task state's table Retry rule and TimeoutSeconds (less the
    ECS start-up allowance, added once to every ECS task). AwaitApproval carries two steps: the request (its Retry) and
    the person's wait (its TimeoutSeconds, and no retry of a timed-out wait)."""
    definition = render_state_machine(config, runner=RUNNER, config_path="configs/releases/qwen-long.yaml")
    states = definition["States"]

    def table_rules(state: dict) -> list[dict]:
        return [r for r in state.get("Retry", []) if r["ErrorEquals"] != list(ECS_INFRA_ERRORS)]

    def seen(state: dict, *, ecs: bool = True) -> dict:
        rules = table_rules(state)
        found = {"retries": rules[0]["MaxAttempts"] if rules else 0,
                 "timeout_s": state["TimeoutSeconds"] - (RUNNER.startup_allowance_s if ecs else 0)}
        if rules:
            found["retried"] = sorted(e.removeprefix("Shiplift.") for e in rules[0]["ErrorEquals"]
                                      if e.startswith("Shiplift."))
            found["backoff"] = (float(rules[0]["IntervalSeconds"]), float(rules[0]["BackoffRate"]),
                                float(rules[0]["MaxDelaySeconds"]))
        return found

    named = {"begin": "Begin", "approval_decision": APPROVAL_TIMED_OUT_STATE, "end": "EndSucceeded", **STATE_NAMES}
    policy = {name: {**seen(states[state]), "defers": states.get(f"{state}Wait", {}).get("Seconds")}
              for name, state in named.items()}  # a deferred stage's poll loop waits this long between polls
    for name, state in named.items():
        assert states[state]["HeartbeatSeconds"] < states[state]["TimeoutSeconds"], state
        assert HEARTBEAT_TIMEOUT in table_rules(states[state])[0]["ErrorEquals"] or not STEPS[name].retries, state
    wait = seen(states[APPROVAL_STATE])
    policy["approval_request"] = {key: value for key, value in wait.items() if key != "timeout_s"}
    policy["approval"] = {"timeout_s": wait["timeout_s"],
                          "retries": sum(1 for r in states[APPROVAL_STATE]["Retry"]
                                         if "States.Timeout" in r["ErrorEquals"])}
    read = seen(states["ReadGateDecision"], ecs=False)
    assert table_rules(states["ReadGateDecision"])[0]["ErrorEquals"] == ["States.TaskFailed"], \
        "an S3 read's own failure"
    policy["read_gate"] = {key: value for key, value in read.items() if key != "retried"}
    return policy


def _expected(name: str, config, *, keys) -> dict:
    step = STEPS[name]
    expected = {"retries": step.retries, "timeout_s": timeout_for(name, config),
                "defers": step.defers.every_s if step.defers else None,
                "retried": sorted(cls.__name__ for cls in RETRYABLE),
                "backoff": (table.BACKOFF.first_s, table.BACKOFF.factor, table.BACKOFF.max_s)}
    return {key: expected[key] for key in keys}


def test_airflow_and_step_functions_set_the_table_s_policy_for_every_step_they_run(long_approval_file, long_approval):
    """Table-driven: for every step of the policy table and every orchestrator it names, what that orchestrator set
    up (retries, what is retried, backoff, per-attempt timeout) is the table's for this config. (The CLI's own run is
    observed in tests/unit/test_approval.py's policy test, on a real release.)"""
    observed = {"airflow": _airflow_policy(long_approval_file), "step_functions": _step_functions_policy(long_approval)}
    for name, step in STEPS.items():
        for orchestrator in sorted(step.runs_in - {"cli"}):
            seen = observed[orchestrator].get(name)
            assert seen is not None, f"{orchestrator} runs no {name}, the table says it does"
            assert seen == _expected(name, long_approval, keys=seen), f"{orchestrator} {name}"
        for orchestrator, policy in observed.items():
            assert name in policy or orchestrator not in step.runs_in, f"{orchestrator} runs {name}, the table says not"


def _failing(calls: list, error: type[Exception]):
    """A step that records each call and always raises `error`."""
    def step():
        calls.append(1)
        raise error("x")
    return step


@pytest.mark.parametrize("name", [name for name, step in STEPS.items() if "cli" in step.runs_in and not step.person])
def test_the_cli_retries_exactly_the_retryable_errors_with_the_table_s_backoff(monkeypatch, name):
    """`table.attempts`, what the CLI runs each step through: attempts and the waits between them, per error."""
    slept: list[float] = []
    monkeypatch.setattr(table.time, "sleep", slept.append)
    for cls in (*RETRYABLE, *NOT_RETRYABLE, RuntimeError):
        calls, slept[:] = [], []
        with pytest.raises(cls):
            table.attempts(name, _failing(calls, cls), timeout_s=60)
        retried = STEPS[name].retries if cls in RETRYABLE else 0
        assert len(calls) == 1 + retried, (name, cls)
        assert slept == [table.BACKOFF.delay(n) for n in range(1, retried + 1)], (name, cls)


def test_a_cli_attempt_that_runs_past_its_timeout_stops_and_is_not_retried():
    calls = []

    def slow():
        calls.append(1)
        time.sleep(5)

    began, handler, outer = time.monotonic(), signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)[0]
    with pytest.raises(StepTimedOut, match="ran past its timeout of 0 s"):
        table.attempts("deploy_candidate", slow, timeout_s=0.2)
    assert calls == [1] and time.monotonic() - began < 2
    assert signal.getsignal(signal.SIGALRM) is handler, "whoever's alarm ran before (pytest-timeout's) is put back"
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    assert (left == 0) if outer == 0 else (outer - 3 < left < outer), "and its timer, less the time that passed"


def test_an_inner_deadline_never_outlives_the_outer_one():
    with table.attempt_deadline("outer", 0.3, print):
        with table.attempt_deadline("inner", 60, print):  # the outer one comes first: it stays in force
            with pytest.raises(StepTimedOut, match="step outer"):
                time.sleep(2)
    with table.attempt_deadline("outer", 60, print):
        with table.attempt_deadline("inner", 0.2, print):
            pass
        assert 59 < signal.getitimer(signal.ITIMER_REAL)[0] <= 60, "the outer deadline is restored after the inner"


def test_a_config_whose_deadlines_exceed_the_orchestrator_is_refused_with_the_fix(long_config):
    validation = long_config.validation.model_copy(update={"deadline_s": 50000.0})
    too_long = long_config.model_copy(update={"validation": validation})
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
    assert (f"image needs {28800 + table.STAGE_MARGIN_S} s, the orchestrator allows {STEPS['image'].timeout_s} s"
            in refused.value.problem)


def test_begin_refuses_a_config_that_outgrew_the_orchestrator_before_anything_is_opened(tmp_path):
    from shiplift.tasks.ledger.store import Ledger
    from shiplift.tasks.pipeline.release import begin_orchestrated
    from tests.tiny_release import write_tiny_config

    config = write_tiny_config(tmp_path / "configs", tmp_path / "state")
    allowed = {**timeouts_for(load_release_config(config)), "validate": STEPS["validate"].timeout_s}
    with pytest.raises(ConfigError, match="validate needs"):
        begin_orchestrated(config, holder="test", allowed_timeouts=allowed, overrides=("validation.deadline_s=7200.0",),
                           progress=lambda message: None)
    ledger_file = tmp_path / "state" / "ledger.db"
    assert not ledger_file.exists() or Ledger(f"sqlite:///{ledger_file}").history() == [], "nothing was opened"


def test_the_table_runs_the_ledger_s_stages_in_their_order_and_every_release_step_has_a_row():
    from shiplift.tasks.ledger import events

    assert table.STAGE_NAMES == events.STAGES
    assert set(table.RELEASE_STEPS) <= set(STEPS) and table.RELEASE_STEPS[0] == "begin"
    assert table.RELEASE_STEPS[-1] == "end"
    assert [name for name in table.RELEASE_STEPS if name in table.STAGE_NAMES] == list(table.STAGE_NAMES)


def test_validate_s_timeout_grows_by_the_cold_starts_of_a_config_that_scales_to_zero():
    from shiplift.tasks.backends.interfaces import SCALE_WAIT_S
    from shiplift.tasks.config import load_release_config

    gemma = Path(__file__).resolve().parents[2] / "configs" / "releases" / "gemma-decision.yaml"
    plain = load_release_config(gemma, environ={})
    scaled = load_release_config(gemma, overrides=("scale_to_zero={cold_starts: 3, max_cold_start_p95_s: 100}",),
                                 environ={})
    assert table.timeout_for("validate", scaled) - table.timeout_for("validate", plain) == 3 * (SCALE_WAIT_S + 200)
