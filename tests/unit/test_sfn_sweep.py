"""A sweep on Step Functions (issue 48 items 4 and 5): OpenSweep, a Map state over the candidates with the sweep's
`parallel` as MaxConcurrency (each iteration a start task, a Wait/Choice loop around a short poll while the endpoint
comes up, then the evaluate task; a teardown when one fails), then PickCandidate and, when the execution's input says
`release_pick: true`, ReleasePick. moto's Step Functions interpreter parses the definition and
runs it with the ECS tasks stubbed; the tasks' parameters validate against botocore's ECS model; the open task's command
runs on a real tiny sweep and keeps the ledger as `shiplift sweep run` does."""

from __future__ import annotations

import json
import re
import time

import boto3
import pytest
import yaml
from moto import mock_aws

from shiplift.tasks.backends.registry import open_ledger
from shiplift.tasks.errors import BadInput, ConfigError, Conflict, NotReady
from shiplift.tasks.ledger import events
from shiplift.tasks.orchestrators.step_functions import ECS_INFRA_ERRORS, ECS_RUN_TASK, POLL_TASK_S, definition_json
from shiplift.tasks.orchestrators.step_functions_map import (
    CHECK_INPUT_STATE,
    DEPLOYED_STATE,
    EVALUATE_STATE,
    INCOMPLETE_STATE,
    INPUT_INVALID_STATE,
    MAP_STATE,
    MODULE,
    NOT_EVALUATED_STATE,
    POLL_STATE,
    READ_POLL_STATE,
    RELEASE_ASKED_STATE,
    RELEASE_FAILED_STATE,
    RELEASE_STATE,
    RELEASED_STATE,
    START_STATE,
    TEARDOWN_STATE,
    WAIT_STATE,
    main,
    parser,
    poll_key,
    render_sweep_machine,
    sweep_machine_name,
)
from shiplift.tasks.orchestrators.task_token import HEARTBEAT_TIMEOUT, retryable_error_names
from shiplift.tasks.pipeline.table import BACKOFF, MAX_STEP_TIMEOUT_S, STEPS
from shiplift.tasks.sweeps.config import load_sweep
from shiplift.tasks.sweeps.orchestrated import evaluation_timeout_s
from shiplift.tasks.sweeps.policy import EVALUATE_RETRIES, candidate_timeout_s
from tests.e2e.test_sweep_run import write_sweep
from tests.unit.test_sfn import (
    PARSER,
    PG,
    REGION,
    ROLE,
    _camel,
    _stub_ecs,
    aws_env,  # noqa: F401 (the fake credentials every moto test here needs)
    entered,
    runner,
    wait_for,
)
from tests.unit.test_sfn_defer import _run

SWEEP_PATH = "configs/sweeps/tiny-sweep.yaml"


def tiny_sweep(tmp_path, tiny_release, *, parallel: int = 2, ledger_url: str | None = PG):
    """The e2e tests' tiny sweep (two quantizations of the tiny model), run `parallel` at once; its base keeps its
    ledger at `ledger_url`."""
    changes = {"backend__ledger_url": ledger_url} if ledger_url else {}
    base = tiny_release.write_tiny_config(tmp_path / "configs", tmp_path / "state", **changes)
    path = write_sweep(tmp_path / "sweeps", base, n_tasks=12, constraints=[{"metric": "valid_rate", "at_least": 1.0}])
    tree = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**tree, "parallel": parallel}))
    return load_sweep(path)


def command(state: dict) -> list[str]:
    """A task's argv with its input-path arguments as <holder> and <candidate>."""
    array = state["Parameters"]["Overrides"]["ContainerOverrides"][0]["Command.$"]
    names = {"$.run.holder": "<holder>", "$.candidate": "<candidate>"}
    found = re.findall(r"'([^']*)'|(\$\.run\.holder|\$\.candidate)", array[len("States.Array("):-1])
    return [literal if literal else names[path] for literal, path in found]


def test_the_map_runs_every_candidate_at_the_sweep_s_parallel_with_the_table_s_policy(tmp_path, tiny_release):
    sweep = tiny_sweep(tmp_path, tiny_release, parallel=2)
    definition = render_sweep_machine(sweep, runner=runner(), sweep_path=SWEEP_PATH)
    states = definition["States"]
    assert states["Prepare"]["Parameters"]["candidates"] == ["Q8_0", "F16"]
    mapped = states[MAP_STATE]
    assert (mapped["Type"], mapped["ItemsPath"], mapped["MaxConcurrency"]) == ("Map", "$.candidates", 2)
    assert mapped["ItemSelector"] == {"candidate.$": "$$.Map.Item.Value", "run.$": "$.run"}
    inner = mapped["ItemProcessor"]["States"]
    assert mapped["ItemProcessor"]["StartAt"] == START_STATE
    start, polled, read = inner[START_STATE], inner[POLL_STATE], inner[READ_POLL_STATE]
    assert command(start) == ["python", "-m", MODULE, "start", SWEEP_PATH, "--holder", "<holder>",
                              "--candidate", "<candidate>"]
    assert (start["Next"], start["Catch"][0]["Next"]) == (POLL_STATE, TEARDOWN_STATE)
    # the wait holds no container: a poll task of minutes, a Choice on its answer, a Wait of the table's interval
    assert command(polled)[3:8] == ["poll", SWEEP_PATH, "--holder", "<holder>", "--candidate"]
    assert polled["TimeoutSeconds"] == POLL_TASK_S + runner().startup_allowance_s
    assert (polled["Next"], read["Next"], polled["Catch"][0]["Next"]) == (READ_POLL_STATE, DEPLOYED_STATE,
                                                                          TEARDOWN_STATE)
    published = command(polled)[command(polled).index("--result-prefix") + 1]
    bucket, prefix = re.fullmatch(r"s3://([^/]+)/(.+)", published).groups()
    template = re.fullmatch(r"States\.Format\('(.+)', \$\.candidate\)", read["Parameters"]["Key.$"])[1]
    assert (read["Parameters"]["Bucket"], template.replace("{}", "Q8_0")) == (
        bucket, poll_key(prefix, "Q8_0", "deploy_candidate")), "ReadCandidatePoll reads what the poll publishes"
    deployed, wait = inner[DEPLOYED_STATE], inner[WAIT_STATE]
    assert (deployed["Choices"][0]["Next"], deployed["Default"]) == (EVALUATE_STATE, WAIT_STATE)
    assert (wait["Type"], wait["Seconds"], wait["Next"]) == ("Wait", STEPS["deploy_candidate"].defers.every_s,
                                                             POLL_STATE)
    evaluate = inner[EVALUATE_STATE]
    assert command(evaluate) == ["python", "-m", MODULE, "evaluate", SWEEP_PATH, "--holder", "<holder>",
                                 "--candidate", "<candidate>"]
    assert command(inner[TEARDOWN_STATE])[3] == "teardown" and evaluate["Catch"][0]["Next"] == TEARDOWN_STATE
    # a candidate's timeout: every stage through the gate and teardown, each with all its attempts, for the slowest
    slowest = max(candidate_timeout_s(c.config) for c in sweep.candidates)
    assert evaluate["TimeoutSeconds"] == start["TimeoutSeconds"] == slowest + runner().startup_allowance_s == \
        evaluation_timeout_s(sweep) + runner().startup_allowance_s
    assert slowest == candidate_timeout_s(sweep.base)  # a quantization changes no stage's timeout
    retried = evaluate["Retry"][-1]
    assert set(retried["ErrorEquals"]) == {*retryable_error_names(), HEARTBEAT_TIMEOUT}
    assert (retried["MaxAttempts"], retried["IntervalSeconds"]) == (EVALUATE_RETRIES, int(BACKOFF.first_s))
    opened = command(states["OpenSweep"])
    assert opened[3:6] == ["open", SWEEP_PATH, "--holder"] and opened[-4:] == [
        "--sweep-id", sweep.sweep_id, "--allowed-timeout-s", str(evaluation_timeout_s(sweep))]
    pick = states["PickCandidate"]
    assert {e for rule in pick["Retry"] for e in rule["ErrorEquals"]}.isdisjoint(retryable_error_names()), \
        "a candidate without evidence (NotReady) is the pick's answer, not retried"
    assert pick["Catch"][0]["Next"] == INCOMPLETE_STATE
    for argv in (command(states["OpenSweep"]), command(evaluate), command(pick)):
        assert parser().parse_args(argv[3:]).sweep == SWEEP_PATH
    assert sweep_machine_name(sweep) == "shiplift-tiny-sweep-sweep"


def test_a_sweep_without_a_shared_ledger_or_with_an_absolute_path_is_refused(tmp_path, tiny_release):
    sweep = tiny_sweep(tmp_path, tiny_release, ledger_url=None)
    with pytest.raises(ConfigError, match="share nothing but the ledger"):
        render_sweep_machine(sweep, runner=runner(), sweep_path=SWEEP_PATH)
    with pytest.raises(BadInput, match="relative .yaml path"):
        render_sweep_machine(sweep, runner=runner(), sweep_path="/abs/tiny-sweep.yaml")


def _stub(definition: dict, failing: str | None = None, done_at_poll: int = 2) -> dict:
    """The ECS tasks (moto cannot run them) as Pass states, inside the Map too, and ReadCandidatePoll fed the poll
    task's answers: not done before poll `done_at_poll`, done then (a counter the start stub sets and each poll adds
    one to, with `States.MathAdd`; the Wait is 1 s). With `failing`, that candidate's evaluate task fails (an S3 read
    of an absent key) and the other candidates' pass."""
    definition = _stub_ecs(definition)
    mapped = definition["States"][MAP_STATE]
    mapped["ItemProcessor"] = _stub_ecs(mapped["ItemProcessor"])
    inner = mapped["ItemProcessor"]["States"]
    read = inner[READ_POLL_STATE]
    inner[START_STATE] = {"Type": "Pass", "Result": 0, "ResultPath": "$.polled", "Next": inner[START_STATE]["Next"]}
    inner[WAIT_STATE]["Seconds"] = 1

    def answer(done: bool) -> dict:
        return {"Type": "Pass", "Parameters": {"envelope": {"result": {"done": done, "candidate.$": "$.candidate"}}},
                "ResultPath": read["ResultPath"], "Next": read["Next"]}

    inner[READ_POLL_STATE] = {"Type": "Pass", "Parameters": {"n.$": "States.MathAdd($.polled, 1)"},
                              "ResultPath": "$.counted", "Next": "Count"}
    inner["Count"] = {"Type": "Pass", "InputPath": "$.counted.n", "ResultPath": "$.polled", "Next": "Answer"}
    inner["Answer"] = {"Type": "Choice", "Choices": [
        {"Variable": "$.polled", "NumericGreaterThanEquals": done_at_poll, "Next": "AnswerDone"}],
        "Default": "AnswerCreating"}
    inner["AnswerDone"], inner["AnswerCreating"] = answer(True), answer(False)
    if failing:
        passing = inner[EVALUATE_STATE]
        inner[EVALUATE_STATE] = {"Type": "Choice", "Choices": [
            {"Variable": "$.candidate", "StringEquals": failing, "Next": "EvaluateFails"}], "Default": "EvaluatePasses"}
        inner["EvaluatePasses"] = passing
        inner["EvaluateFails"] = {"Type": "Task", "Resource": "arn:aws:states:::aws-sdk:s3:getObject",
                                  "Parameters": {"Bucket": "shiplift-results", "Key": "absent"},
                                  "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error",
                                             "Next": TEARDOWN_STATE}], "Next": passing["Next"]}
    return definition


def test_moto_runs_the_map_over_every_candidate_and_a_failed_one_is_torn_down_while_the_others_go_on(tmp_path,
                                                                                                      tiny_release):
    sweep = tiny_sweep(tmp_path, tiny_release, parallel=2)
    definition = render_sweep_machine(sweep, runner=runner(), sweep_path=SWEEP_PATH)
    status, route = _run(_stub(definition))
    assert status == "SUCCEEDED", route
    assert route.count(EVALUATE_STATE) == len(sweep.candidates) and TEARDOWN_STATE not in route
    assert route.count(POLL_STATE) == 2 * len(sweep.candidates) and route.count(WAIT_STATE) == len(sweep.candidates), \
        "each candidate polled, waited (no container held), polled again and was evaluated once deployed"
    assert route[:4] == ["Prepare", CHECK_INPUT_STATE, "OpenSweep", MAP_STATE]
    assert route[-3:] == ["PickCandidate", RELEASE_ASKED_STATE, "Swept"]  # no input: the pick is not released

    status, route = _run(_stub(definition, failing="F16"))
    assert status == "SUCCEEDED", route  # the stubbed pick passes; the real one fails until a rerun has evidence
    assert route.count("EvaluateFails") == 1 and route.count("EvaluatePasses") == 1
    assert route.count(TEARDOWN_STATE) == 1 and route.count(NOT_EVALUATED_STATE) == 1
    assert route.index("PickCandidate") > max(i for i, name in enumerate(route) if name == NOT_EVALUATED_STATE)


def test_the_open_task_opens_the_sweep_once_and_refuses_a_changed_sweep_or_a_short_timeout(tmp_path, tiny_release):
    """The open command on a real tiny sweep (its ledger local): the rule's sha256 recorded once; a sweep file whose
    candidates changed since the state machine was rendered, or whose candidates need longer than the evaluate task
    allows, is refused before anything is recorded."""
    sweep = tiny_sweep(tmp_path, tiny_release, ledger_url=None)
    argv = ["open", str(sweep.path), "--holder", "stepfunctions:exec-1"]
    with pytest.raises(Conflict, match="render and deploy"):
        main([*argv, "--sweep-id", "sweep-tiny-sweep-000000000000"])
    with pytest.raises(ConfigError, match="allows 1 s"):
        main([*argv, "--sweep-id", sweep.sweep_id, "--allowed-timeout-s", "1"])
    assert not (tmp_path / "state" / "ledger.db").exists(), "refused before the ledger was touched"
    for _ in range(2):
        assert main([*argv, "--sweep-id", sweep.sweep_id, "--allowed-timeout-s",
                     str(evaluation_timeout_s(sweep))]) == 0
    ledger = open_ledger(state_dir=tmp_path / "state")
    own = ledger.release(sweep.sweep_id)
    assert [(r.event, r.actor) for r in own] == [(events.OPENED, "stepfunctions:exec-1")]
    assert own[0].payload["rule_sha256"] == sweep.config.rule.sha256()
    with pytest.raises(BadInput, match="no candidate 'Q4_0'"):
        main(["evaluate", str(sweep.path), "--holder", "h", "--candidate", "Q4_0"])
    ledger.close()


def test_the_poll_task_publishes_what_the_choice_reads_and_is_done_at_once_once_evaluated(tmp_path, tiny_release,
                                                                                         monkeypatch):
    """A real tiny candidate started by the start command: each poll command publishes `{done, candidate, …}` where
    ReadCandidatePoll reads it (moto's S3) until its endpoint is in service; after the evaluate command a poll is done
    at once, renewing nothing (a machine polls after every start, a candidate with evidence too)."""
    sweep = tiny_sweep(tmp_path, tiny_release, ledger_url=None)
    monkeypatch.setenv("SHIPLIFT_HOME", str(tmp_path / "state"))  # as the ECS task's environment sets it
    holder, candidate = "stepfunctions:exec-1", sweep.candidates[0]
    steps = [str(sweep.path), "--holder", holder, "--candidate", candidate.name]
    poll = ["poll", *steps, "--result-prefix", "s3://shiplift-results/sweep-polls"]
    main(["open", str(sweep.path), "--holder", holder])
    main(["start", *steps])
    try:
        with mock_aws():
            s3 = boto3.client("s3", region_name=REGION)
            s3.create_bucket(Bucket="shiplift-results")

            def published() -> dict:
                main(poll)
                key = poll_key("sweep-polls", candidate.name, "deploy_candidate")
                return json.loads(s3.get_object(Bucket="shiplift-results", Key=key)["Body"].read())

            deadline = time.monotonic() + 120
            while not (answer := published())["result"]["done"]:
                assert time.monotonic() < deadline, "the tiny candidate's endpoint came up"
                time.sleep(0.5)  # the Wait between polls, shortened
            assert (answer["release_id"], answer["result"]["candidate"]) == (candidate.release_id, candidate.name)
            main(["evaluate", *steps])
            assert published()["result"]["status"].startswith("nothing to wait for")
        ledger = open_ledger(state_dir=tmp_path / "state")
        assert [r.event for r in ledger.release(sweep.sweep_id)] == [events.OPENED, events.EVALUATED]
        ledger.close()
    finally:
        tiny_release.stop_endpoints(tmp_path / "state")


def test_render_prints_the_machine_from_a_sweep_file_and_runner_settings(tmp_path, tiny_release, capsys,
                                                                           monkeypatch):
    sweep = tiny_sweep(tmp_path, tiny_release)
    settings = tmp_path / "runner.yaml"
    settings.write_text(yaml.safe_dump(runner().model_dump(mode="json")))
    monkeypatch.chdir(tmp_path)
    relative = str(sweep.path.relative_to(tmp_path))
    assert main(["render", relative, "--runner", str(settings)]) == 0
    assert json.loads(capsys.readouterr().out) == render_sweep_machine(load_sweep(relative), runner=runner(),
                                                                       sweep_path=relative)
    with pytest.raises(SystemExit):
        main(["render", relative])  # no runner settings
    with pytest.raises(SystemExit):
        main(["pick", relative])  # no holder


def ecs_tasks(definition: dict) -> dict[str, dict]:
    """Every ECS task of the sweep machine, the Map's iteration's included."""
    states = {**definition["States"], **definition["States"][MAP_STATE]["ItemProcessor"]["States"]}
    return {name: state for name, state in states.items() if state.get("Resource") == ECS_RUN_TASK}


def test_the_pick_is_released_by_one_task_only_when_the_input_asks(tmp_path, tiny_release):
    """After PickCandidate, a Choice on the execution input's `release_pick` (absent: false); ReleasePick runs the
    pick's release in one ECS task, bounded as Airflow's release_pick task is and beating its heartbeat; its container
    is started again only when it never ran (a release cut short is the person's to look at, as on Airflow)."""
    sweep = tiny_sweep(tmp_path, tiny_release)
    states = render_sweep_machine(sweep, runner=runner(), sweep_path=SWEEP_PATH)["States"]
    assert states["Prepare"]["Parameters"]["input.$"] == "$" and states["Prepare"]["Next"] == CHECK_INPUT_STATE
    assert states[CHECK_INPUT_STATE]["Default"] == "OpenSweep"
    assert states["PickCandidate"]["Next"] == RELEASE_ASKED_STATE
    asked = states[RELEASE_ASKED_STATE]
    assert asked["Type"] == "Choice" and asked["Default"] == "Swept"
    assert asked["Choices"][0]["Next"] == RELEASE_STATE
    released = states[RELEASE_STATE]
    assert command(released) == ["python", "-m", MODULE, "release-pick", SWEEP_PATH, "--holder", "<holder>"]
    assert parser().parse_args(command(released)[3:]).action == "release-pick"
    assert released["TimeoutSeconds"] == MAX_STEP_TIMEOUT_S + runner().startup_allowance_s
    assert 0 < released["HeartbeatSeconds"] < released["TimeoutSeconds"]
    assert [rule["ErrorEquals"] for rule in released["Retry"]] == [list(ECS_INFRA_ERRORS)]
    assert released["Next"] == RELEASED_STATE and states[RELEASED_STATE]["Type"] == "Succeed"
    assert released["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error",
                                  "Next": RELEASE_FAILED_STATE}]
    assert states[RELEASE_FAILED_STATE]["Type"] == states[INPUT_INVALID_STATE]["Type"] == "Fail"


def _execute(definition: dict, execution_input: dict | str) -> tuple[str, list[str]]:
    """Run the (stubbed) definition in moto with this input: the execution's status and the states it entered."""
    with mock_aws(config=PARSER):
        sfn = boto3.client("stepfunctions", region_name=REGION)
        arn = sfn.create_state_machine(name="sweep", definition=definition_json(definition),
                                       roleArn=ROLE)["stateMachineArn"]
        text = execution_input if isinstance(execution_input, str) else json.dumps(execution_input)
        execution = sfn.start_execution(stateMachineArn=arn, input=text)["executionArn"]
        return wait_for(sfn, execution, deadline_s=60)["status"], entered(sfn, execution)


@pytest.mark.parametrize(("execution_input", "status", "ending"), [
    ({"release_pick": True}, "SUCCEEDED", ["PickCandidate", RELEASE_ASKED_STATE, RELEASE_STATE, RELEASED_STATE]),
    ({"release_pick": False}, "SUCCEEDED", ["PickCandidate", RELEASE_ASKED_STATE, "Swept"]),
    ({"other": 1}, "SUCCEEDED", ["PickCandidate", RELEASE_ASKED_STATE, "Swept"]),
    ({"release_pick": "yes"}, "FAILED", ["Prepare", CHECK_INPUT_STATE, INPUT_INVALID_STATE]),
])
def test_moto_releases_the_pick_only_when_the_input_says_release_pick_true(tmp_path, tiny_release, execution_input,
                                                                           status, ending):
    """Both ways of the Choice, and an input whose release_pick is no boolean, refused before anything runs."""
    sweep = tiny_sweep(tmp_path, tiny_release)
    found, route = _execute(_stub(render_sweep_machine(sweep, runner=runner(), sweep_path=SWEEP_PATH)),
                            execution_input)
    assert (found, route[-len(ending):]) == (status, ending), route
    assert (RELEASE_STATE in route) == (execution_input.get("release_pick") is True)


def test_the_sweep_machine_s_tasks_validate_against_the_botocore_ecs_model(tmp_path, tiny_release):
    from botocore.session import get_session
    from botocore.validate import validate_parameters

    run_task = get_session().get_service_model("ecs").operation_model("RunTask").input_shape
    sweep = tiny_sweep(tmp_path, tiny_release)
    found = ecs_tasks(render_sweep_machine(sweep, runner=runner(), sweep_path=SWEEP_PATH))
    assert set(found) == {"OpenSweep", START_STATE, POLL_STATE, EVALUATE_STATE, TEARDOWN_STATE, "PickCandidate",
                          RELEASE_STATE}
    for state in found.values():
        validate_parameters(_camel(state["Parameters"]), run_task)


def test_the_release_pick_task_runs_the_orchestrated_release_of_the_pick(tmp_path, tiny_release):
    """The command ReleasePick runs calls `release_pick_orchestrated`: before the sweep picked it refuses (NotReady)."""
    sweep = tiny_sweep(tmp_path, tiny_release, ledger_url=None)
    main(["open", str(sweep.path), "--holder", "stepfunctions:exec-1"])
    with pytest.raises(NotReady, match="has not picked yet"):
        main(["release-pick", str(sweep.path), "--holder", "stepfunctions:exec-1"])
