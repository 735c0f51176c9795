"""The release as a Step Functions state machine: ASL validity, graph invariants, deploy idempotency."""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import time
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from moto import mock_aws

from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import BadInput, ConfigError, Conflict, NotFound
from shiplift.tasks.ledger.events import STAGES
from shiplift.tasks.orchestrators.step_functions import (
    ECS_RUN_TASK,
    FAILED_STATE,
    STATE_NAMES,
    TEARDOWN_STATES,
    RunnerSettings,
    definition_json,
    deploy_state_machine,
    load_runner_settings,
    publish_stage_result,
    render_state_machine,
    state_machine_name,
    verify_task_definition,
)
from shiplift.tasks.orchestrators.task_token import retryable_error_names
from shiplift.tasks.pipeline.release import release_id_for
from shiplift.tasks.pipeline.table import STAGES as TABLE_STAGES

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ("qwen35-4b-semif.yaml", "gemma-decision.yaml")
REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/shiplift-stepfunctions"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/shiplift/pipeline@sha256:" + "a" * 64
PARSER = {"stepfunctions": {"execute_state_machine": True}}  # moto runs the ASL parser and executes


@pytest.fixture(autouse=True)
def aws_env(monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", REGION)):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def runner(**changes) -> RunnerSettings:
    base = dict(cluster="shiplift", task_definition="shiplift-pipeline:3", pipeline_image=IMAGE,
                subnets=["subnet-0123456789abcdef0"], security_groups=["sg-0123456789abcdef0"],
                result_bucket="shiplift-results", post_promote_wait_s=1)
    return RunnerSettings(**{**base, **changes})


PG = "postgresql+psycopg2://shiplift@ledger.internal.example:5432/shiplift"


def config(name: str, *overrides: str):
    """A shipped config; the local demo config gets a PostgreSQL ledger, which Step Functions tasks need to share
    state."""
    ledger = () if "ledger_url" in (ROOT / "configs" / "releases" / name).read_text() else (f"backend.ledger_url={PG}",)
    return load_release_config(ROOT / "configs" / "releases" / name, overrides=(*ledger, *overrides), environ={})


def render(name: str = "gemma-decision.yaml", overrides: tuple[str, ...] = (), **runner_changes) -> dict:
    return render_state_machine(config(name, *overrides), runner=runner(**runner_changes),
                                config_path=f"configs/releases/{name}")


def tasks_of(definition: dict) -> dict[str, dict]:
    return {n: s for n, s in definition["States"].items() if s["Type"] == "Task"}


def command(state: dict) -> list[str]:
    """A task's argv; the execution's lease holder (`$.run.holder` in a `States.Array`) reads as `<holder>`."""
    override = state["Parameters"]["Overrides"]["ContainerOverrides"][0]
    if "Command" in override:
        return override["Command"]
    array = override["Command.$"]
    assert array.startswith("States.Array(") and array.endswith(")"), array
    return [literal if literal or not holder else "<holder>"
            for literal, holder in re.findall(r"'([^']*)'|(\$\.run\.holder)", array[len("States.Array("):-1])]


def successors(state: dict) -> list[str]:
    found = [state[k] for k in ("Next", "Default") if k in state]
    found += [c["Next"] for c in state.get("Choices", [])]
    found += [c["Next"] for c in state.get("Catch", [])]
    return found


def loop_back(name: str, target: str) -> bool:
    """The one edge that may close a cycle: a deferred stage's Wait going back to its poll (test_sfn_defer.py runs
    that loop)."""
    return name.endswith("Wait") and target == name.removesuffix("Wait") + "Poll"


def paths(definition: dict, start: str | None = None) -> list[list[str]]:
    """Every path from `start` to a terminal state (the graph has no cycles but the deferred stages' poll loops,
    whose back edge is not followed; asserted below)."""
    states, out = definition["States"], []

    def walk(name: str, seen: list[str]) -> None:
        assert name not in seen, f"cycle through {name}"
        seen = seen + [name]
        following = [target for target in successors(states[name]) if not loop_back(name, target)]
        if not successors(states[name]):
            out.append(seen)
        for nxt in following:
            walk(nxt, seen)

    walk(start or definition["StartAt"], [])
    return out


def reachable(definition: dict) -> set[str]:
    """Every state reachable from StartAt, the poll loops' Wait states included (which `paths` ends at)."""
    states, found, frontier = definition["States"], set(), [definition["StartAt"]]
    while frontier:
        current = frontier.pop()
        if current not in found:
            found.add(current)
            frontier += successors(states[current])
    return found


def wait_for(client, execution_arn: str, deadline_s: float = 20.0) -> dict:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        described = client.describe_execution(executionArn=execution_arn)
        if described["status"] != "RUNNING":
            return described
        time.sleep(0.05)
    raise AssertionError(f"{execution_arn} still running after {deadline_s}s")


# the stand-ins `answered` puts in a deferred stage's loop (its counter and canned answers): no state of the machine
ANSWER_STUBS = ("Count", "Answer", "AnswerDone", "AnswerCreating")
# the deferred promote's states an execution enters when its first poll answers done (`answered`)
PROMOTE_LOOP = ["Promote", "PromotePoll", "PromoteReadPoll", "PromoteDone", "PromoteFinish"]


def entered(client, execution_arn: str) -> list[str]:
    """The states an execution entered, in order, less the stand-ins of `answered`."""
    events = client.get_execution_history(executionArn=execution_arn)["events"]
    return [e["stateEnteredEventDetails"]["name"] for e in events
            if "stateEnteredEventDetails" in e and not e["stateEnteredEventDetails"]["name"].endswith(ANSWER_STUBS)]


# --- validity: moto's ASL parser accepts it and an execution starts ---------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_definition_is_json_moto_parses_creates_and_starts(name):
    definition = render(name)
    text = definition_json(definition)
    assert json.loads(text) == definition
    with mock_aws(config=PARSER):
        sfn = boto3.client("stepfunctions", region_name=REGION)
        arn = sfn.create_state_machine(name=state_machine_name(config(name)), definition=text,
                                       roleArn=ROLE)["stateMachineArn"]
        execution = sfn.start_execution(stateMachineArn=arn, name="run-1", input="{}")["executionArn"]
        wait_for(sfn, execution)  # moto has no ECS `.sync` backend, so Begin fails; the intrinsics ran first
        events = sfn.get_execution_history(executionArn=execution)["events"]
    prepared = json.loads(next(e for e in events
                               if e["type"] == "PassStateExited")["stateExitedEventDetails"]["output"])
    assert prepared["run"]["holder"] == f"stepfunctions:{execution}"
    scheduled = json.loads(next(e for e in events
                                if e["type"] == "TaskScheduled")["taskScheduledEventDetails"]["parameters"])
    override = scheduled["Overrides"]["ContainerOverrides"][0]
    assert override["Command"][:4] == ["shiplift", "orchestrate", "begin", f"configs/releases/{name}"]
    assert override["Command"][4:6] == ["--holder", f"stepfunctions:{execution}"]
    assert {"Name": "SHIPLIFT_ACTOR", "Value": f"stepfunctions:{execution}"} in override["Environment"]


def test_moto_parser_rejects_a_broken_definition():
    """The validity check above has teeth: the same parser refuses a malformed definition."""
    broken = render()
    broken["States"]["Resolve"]["Retry"][0]["JitterStrategy"] = "SOMETIMES"
    with mock_aws(config=PARSER):
        sfn = boto3.client("stepfunctions", region_name=REGION)
        with pytest.raises(ClientError, match="ASLParserException.*SOMETIMES"):
            sfn.create_state_machine(name="broken", definition=definition_json(broken), roleArn=ROLE)


# --- the stage graph ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_every_stage_is_a_task_running_shiplift_stage(name):
    definition = render(name)
    cfg = config(name)
    rid = release_id_for(cfg)
    ecs = [s for s in tasks_of(definition).values() if s["Resource"] == ECS_RUN_TASK]
    commands = [command(s) for s in ecs]
    for stage in STAGES:
        matching = [c for c in commands if c[:3] == ["shiplift", "stage", stage]]
        assert matching, f"no Task runs `shiplift stage {stage}`"
        for argv in matching:
            assert argv[3:9] == ["--release", rid, "--ledger-url", cfg.backend.ledger_url, "--holder", "<holder>"]
    for state in tasks_of(definition).values():
        if state["Resource"] == ECS_RUN_TASK:
            params = state["Parameters"]
            assert (params["Cluster"], params["TaskDefinition"],
                    params["LaunchType"]) == ("shiplift", "shiplift-pipeline:3", "FARGATE")
            assert state["ResultPath"] is None


def test_release_id_is_the_one_the_container_opens_wherever_its_state_lives():
    """The begin task loads the same file on another machine, with another scratch dir: the same release id."""
    definition = render("qwen35-4b-semif.yaml")
    begin = definition["States"]["Begin"]["Parameters"]["Overrides"]["ContainerOverrides"][0]["Command.$"]
    assert "--set" not in begin, "nothing about where state lives is passed to the config"
    in_container = load_release_config(ROOT / "configs/releases/qwen35-4b-semif.yaml",
                                       overrides=("backend.state_dir=/tmp/elsewhere",), environ={})
    assert command(definition["States"]["Resolve"])[4] == release_id_for(in_container)


def test_a_config_without_a_shared_ledger_is_refused():
    local = load_release_config(ROOT / "configs/releases/gemma-decision.yaml", environ={})
    with pytest.raises(ConfigError, match="share nothing but the ledger"):
        render_state_machine(local, runner=runner(), config_path="configs/releases/gemma-decision.yaml")


def test_release_id_and_config_path_are_checked():
    cfg = config("gemma-decision.yaml")
    with pytest.raises(Conflict, match="not the release the tasks will open"):
        render_state_machine(cfg, release_id=release_id_for(cfg) + "x", runner=runner(),
                             config_path="configs/releases/gemma-decision.yaml")
    for bad in ("/home/me/configs/releases/gemma-decision.yaml", "../gemma-decision.yaml", "configs/releases/gemma"):
        with pytest.raises(BadInput, match="relative .yaml path"):
            render_state_machine(cfg, runner=runner(), config_path=bad)
    with pytest.raises(BadInput, match="reserve"):
        render_state_machine(cfg, runner=runner(), config_path="configs/releases/it's.yaml")
    with pytest.raises(ConfigError, match="no bucket for stage results"):
        render("gemma-decision.yaml", result_bucket=None)


def test_qwen_results_default_to_the_aws_backend_bucket():
    definition = render("qwen35-4b-semif.yaml", result_bucket=None)
    assert definition["States"]["ReadGateDecision"]["Parameters"]["Bucket"] == "shiplift-artifacts-example"


@pytest.mark.parametrize("name", CONFIGS)
def test_every_failure_path_tears_down_then_records_before_failing(name):
    definition = render(name)
    states = definition["States"]
    all_paths = paths(definition)
    terminal = {p[-1] for p in all_paths}
    assert terminal == {"Released", FAILED_STATE, "BeginFailed", "EndNotRecorded"}
    for path in all_paths:
        if path[-1] == "BeginFailed":  # nothing of this run exists yet: no lease, no candidate to remove
            assert path == ["Prepare", "Begin", "BeginFailed"]
            continue
        teardown_at = [i for i, s in enumerate(path) if s in TEARDOWN_STATES]
        assert teardown_at, f"path reaches {path[-1]} without tearing the candidate down: {path}"
        if path[-1] == FAILED_STATE:
            assert "EndFailed" in path[teardown_at[0]:], f"failure not recorded on {path}"
        if path[-1] == "Released":
            assert path[-3:] == ["TeardownCandidate", "EndSucceeded", "Released"]
    # Every Catch after Begin leads into a teardown (or, from a teardown, straight to recording the failure).
    for state_name, state in tasks_of(definition).items():
        for catch in state["Catch"]:
            if state_name == "Begin":
                continue
            downstream = paths(definition, catch["Next"])
            if state_name in TEARDOWN_STATES:
                assert catch["Next"] == "EndFailed"
            elif state_name in ("EndSucceeded", "EndFailed"):
                assert states[catch["Next"]]["Type"] == "Fail"
            else:
                assert all(p[0] == "TeardownAfterFailure" for p in downstream), (state_name, downstream)


def _assert_retry_and_catch_rules(state_name: str, state: dict) -> None:
    """A Task state times out, retries and catches as the ASL allows, and no failure escapes its Catch."""
    assert 1 <= state["TimeoutSeconds"], state_name
    assert state["Retry"] and state["Catch"], f"{state_name} lacks Retry or Catch"
    for rule in state["Retry"] + state["Catch"]:
        errors = rule["ErrorEquals"]
        assert errors and len(set(errors)) == len(errors), state_name
        assert "States.ALL" not in errors or errors == ["States.ALL"], "States.ALL must stand alone"
    for rules in (state["Retry"], state["Catch"]):
        for rule in rules[:-1]:
            assert "States.ALL" not in rule["ErrorEquals"], "States.ALL must be the last rule"
    assert state["Catch"][-1]["ErrorEquals"] == ["States.ALL"], f"{state_name}: a failure could escape the Catch"
    for rule in state["Retry"]:
        assert rule["IntervalSeconds"] >= 1 and rule["BackoffRate"] >= 1.0 and rule["MaxAttempts"] >= 1
        assert rule["MaxDelaySeconds"] >= rule["IntervalSeconds"] and rule["JitterStrategy"] in ("FULL", "NONE")


@pytest.mark.parametrize("name", CONFIGS)
def test_retry_catch_and_references_follow_the_asl_rules(name):
    definition = render(name)
    states = definition["States"]
    assert reachable(definition) == set(states), f"unreachable states: {set(states) - reachable(definition)}"
    for state_name, state in states.items():
        for target in successors(state):
            assert target in states, f"{state_name} -> missing {target}"
        if state["Type"] == "Task":
            _assert_retry_and_catch_rules(state_name, state)
    # Infrastructure errors (no capacity, RunTask failures) come first and are retried on every ECS task.
    for state in tasks_of(definition).values():
        if state["Resource"] == ECS_RUN_TASK:
            assert "AmazonECS.Unknown" in state["Retry"][0]["ErrorEquals"]
    # A task reports its error's class: only the retryable ones (and a container that stopped heartbeating) are retried.
    retried = [*retryable_error_names(), "States.HeartbeatTimeout"]
    assert {"Shiplift.NotReady", "Shiplift.CapacityError", "Shiplift.Throttled"} <= set(retried)
    task_failed = {n: r["MaxAttempts"] for n, s in tasks_of(definition).items() for r in s["Retry"]
                   if r["ErrorEquals"] == retried}
    assert task_failed["Validate"] == task_failed["Promote"] == 1  # a retry re-runs an evaluation / touches production
    assert task_failed["TeardownAfterFailure"] == max(task_failed.values())  # the candidate must go
    never_retried = {"Shiplift.ConfigError", "Shiplift.GateFailed", "Shiplift.IntegrityError", "Shiplift.LeaseHeld",
                     "Shiplift.LeaseLost", "Shiplift.UnexpectedError", "States.TaskFailed", "States.ALL"}
    for state_name, state in tasks_of(definition).items():
        if state["Resource"] == ECS_RUN_TASK:  # (reading the gate's result from S3 may retry any S3 failure)
            assert not never_retried & {e for r in state["Retry"] for e in r["ErrorEquals"]}, state_name
    cfg = config(name)
    assert states["Validate"]["TimeoutSeconds"] >= cfg.validation.deadline_s
    if cfg.placement.kind == "instance_pool":
        assert states["DeployCandidate"]["TimeoutSeconds"] > cfg.placement.provision_timeout_s


@pytest.mark.parametrize("name", CONFIGS)
def test_the_choice_reads_the_validate_result(name):
    definition = render(name)
    states = definition["States"]
    publish = command(states["Validate"])
    assert publish[-2] == "--result-uri"
    read = states["ReadGateDecision"]
    assert read["Resource"] == "arn:aws:states:::aws-sdk:s3:getObject"
    assert publish[-1] == f"s3://{read['Parameters']['Bucket']}/{read['Parameters']['Key']}"
    assert states["Validate"]["Next"] == "ReadGateDecision" and read["Next"] == "GateDecision"
    assert read["ResultPath"] == "$.gate" and read["ResultSelector"] == {"envelope.$": "States.StringToJson($.Body)"}
    choice = states["GateDecision"]
    promote_rule = choice["Choices"][-1]
    assert promote_rule == {"Variable": "$.gate.envelope.result.decision", "StringEquals": "pass", "Next": "Promote"}
    assert choice["Default"] == "TeardownCandidate"


def test_bake_wait_follows_the_rollout():
    canary = render("gemma-decision.yaml",
                    ("rollout.strategy=canary", "rollout.copies=2", "rollout.wait_interval_s=420",
                                            "rollout.maximum_execution_timeout_s=9000"), post_promote_wait_s=30)
    assert canary["States"]["PromoteFinish"]["Next"] == "Bake"
    assert canary["States"]["Bake"] == {**canary["States"]["Bake"], "Type": "Wait", "Seconds": 30,
                                        "Next": "TeardownCandidate"}
    assert canary["States"]["Promote"]["TimeoutSeconds"] > 9000, "promote's timeout covers the rollout's own deadline"
    all_at_once = render("gemma-decision.yaml", post_promote_wait_s=90)
    assert all_at_once["States"]["Bake"]["Seconds"] == 90
    no_wait = render("gemma-decision.yaml", post_promote_wait_s=0)
    assert "Bake" not in no_wait["States"] and no_wait["States"]["PromoteFinish"]["Next"] == "TeardownCandidate"


def _stub_ecs(definition: dict, failing: tuple[str, ...] = ()) -> dict:
    """Replace the ECS tasks (moto cannot run them) by Pass states, or by a task that fails."""
    definition = copy.deepcopy(definition)
    for name, state in list(definition["States"].items()):
        if state.get("Resource") != ECS_RUN_TASK:
            continue
        if name in failing:
            state.update(Resource="arn:aws:states:::aws-sdk:s3:getObject",
                         Parameters={"Bucket": "shiplift-results", "Key": "absent"})
            state.pop("Retry")
        else:
            definition["States"][name] = {"Type": "Pass",
                                          **{k: state[k] for k in ("Next", "End", "ResultPath") if k in state}}
    return definition


def answered(definition: dict, release_id: str, *, done_at_poll: int = 1, stage: str | None = None) -> dict:
    """The deferred stage's ReadPoll fed the poll task's answers (as `_with_envelope` feeds the gate's): polls before
    `done_at_poll` say still creating, that one says done. The start stub sets a counter each poll adds one to (with
    `States.MathAdd`, which moto's interpreter runs), and the Wait is 1 s. `stage` None: every stage the table
    defers (deploy_candidate, promote)."""
    if stage is None:
        for deferring in (step.name for step in TABLE_STAGES if step.defers):
            answered(definition, release_id, done_at_poll=done_at_poll, stage=deferring)
        return definition
    states, name = definition["States"], STATE_NAMES[stage]
    read, where = states[name + "ReadPoll"], f"$.polls.{stage}"
    states[name] = {"Type": "Pass", "Result": 0, "ResultPath": "$.polled", "Next": states[name]["Next"]}
    states[name + "Wait"]["Seconds"] = 1

    def answer(done: bool) -> dict:
        return {"Type": "Pass", "Result": {"envelope": {"release_id": release_id, "stage": stage,
                                                        "result": {"done": done, "status": "stub", "left_s": 60}}},
                "ResultPath": where, "Next": read["Next"]}

    states[name + "ReadPoll"] = {"Type": "Pass", "Parameters": {"n.$": "States.MathAdd($.polled, 1)"},
                                 "OutputPath": "$", "ResultPath": "$.counted", "Next": name + "Count"}
    states[name + "Count"] = {"Type": "Pass", "InputPath": "$.counted.n", "ResultPath": "$.polled",
                              "Next": name + "Answer"}
    states[name + "Answer"] = {"Type": "Choice", "Choices": [
        {"Variable": "$.polled", "NumericGreaterThanEquals": done_at_poll, "Next": name + "AnswerDone"}],
        "Default": name + "AnswerCreating"}
    states[name + "AnswerDone"], states[name + "AnswerCreating"] = answer(True), answer(False)
    return definition


def _with_envelope(definition: dict, envelope: dict) -> dict:
    """moto's aws-sdk S3 integration returns a stream where Step Functions returns the Body as a string:
    feed the same JSON text through the same `States.StringToJson($.Body)` expression."""
    read = definition["States"]["ReadGateDecision"]
    definition["States"]["ReadGateDecision"] = {"Type": "Pass", "Result": {"Body": json.dumps(envelope)},
                                                "ResultPath": "$.s3object", "Next": "ParseGateDecision"}
    definition["States"]["ParseGateDecision"] = {
        "Type": "Pass",
        "Parameters": {"envelope.$": read["ResultSelector"]["envelope.$"].replace("$.Body", "$.s3object.Body")},
        "ResultPath": read["ResultPath"], "Next": read["Next"]}
    return definition


def test_executions_route_on_the_decision_and_tear_down_on_failure():
    definition = render()
    rid = release_id_for(config("gemma-decision.yaml"))

    def envelope(decision, release=rid):
        return {"release_id": release, "stage": "validate", "result": {"decision": decision}}

    cases = {
        "pass": (_with_envelope(answered(_stub_ecs(definition), rid), envelope("pass")), "SUCCEEDED"),
        "fail": (_with_envelope(answered(_stub_ecs(definition), rid), envelope("fail")), "SUCCEEDED"),
        "stale": (_with_envelope(answered(_stub_ecs(definition), rid), envelope("pass", "other-release")), "FAILED"),
        "build-fails": (_stub_ecs(definition, failing=("Build",)), "FAILED"),
        "teardown-fails": (_with_envelope(answered(_stub_ecs(definition, failing=("TeardownCandidate",)), rid),
                                          envelope("pass")), "FAILED"),
    }
    routes = {}
    with mock_aws(config=PARSER):
        boto3.client("s3", region_name=REGION).create_bucket(Bucket="shiplift-results")
        sfn = boto3.client("stepfunctions", region_name=REGION)
        for case, (stubbed, expected) in cases.items():
            arn = sfn.create_state_machine(name=f"routes-{case}", definition=definition_json(stubbed),
                                           roleArn=ROLE)["stateMachineArn"]
            execution = sfn.start_execution(stateMachineArn=arn, input="{}")["executionArn"]
            assert wait_for(sfn, execution)["status"] == expected, case
            routes[case] = [s for s in entered(sfn, execution) if s != "ParseGateDecision" and not s.startswith(
                ("DeployCandidateCount", "DeployCandidateAnswer"))]
    stages = ["Prepare", "Begin", "Resolve", "Build", "Package", "Image", "DeployCandidate", "DeployCandidatePoll",
              "DeployCandidateReadPoll", "DeployCandidateDone", "DeployCandidateFinish", "Validate",
              "ReadGateDecision", "GateDecision"]
    assert routes["pass"] == stages + [*PROMOTE_LOOP, "Bake", "TeardownCandidate", "EndSucceeded", "Released"]
    assert routes["fail"] == stages + ["TeardownCandidate", "EndSucceeded", "Released"]
    assert routes["stale"] == stages + ["GateResultInvalid", "TeardownAfterFailure", "EndFailed", FAILED_STATE]
    assert routes["build-fails"] == ["Prepare", "Begin", "Resolve", "Build", "TeardownAfterFailure", "EndFailed",
                                     FAILED_STATE]
    assert routes["teardown-fails"] == stages + [*PROMOTE_LOOP, "Bake", "TeardownCandidate", "EndFailed",
                                                 FAILED_STATE]


# --- the requests match the AWS service models ----------------------------------------------------


def _camel(value, dynamic_stand_in: str = "x"):
    """Step Functions' PascalCase parameters as the boto3 (camelCase) request they become."""
    if isinstance(value, list):
        return [_camel(v, dynamic_stand_in) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key.endswith(".$"):
            key, item = key[:-2], ([dynamic_stand_in] if key == "Command.$" else dynamic_stand_in)
        out[key[0].lower() + key[1:]] = _camel(item, dynamic_stand_in)
    return out


@pytest.mark.parametrize("name", CONFIGS)
def test_task_parameters_validate_against_the_botocore_models(name):
    from botocore.session import get_session
    from botocore.validate import validate_parameters

    session = get_session()
    run_task = session.get_service_model("ecs").operation_model("RunTask").input_shape
    get_object = session.get_service_model("s3").operation_model("GetObject").input_shape
    for state in tasks_of(render(name)).values():
        if state["Resource"] == ECS_RUN_TASK:
            validate_parameters(_camel(state["Parameters"]), run_task)
        else:
            validate_parameters(state["Parameters"], get_object)
    with pytest.raises(Exception, match="Unknown parameter"):
        validate_parameters({**_camel(tasks_of(render(name))["Build"]["Parameters"]), "imageOverride": "x"}, run_task)


# --- deploy ----------------------------------------------------------------------------------------


def test_deploy_creates_then_is_unchanged_then_updates():
    cfg = config("qwen35-4b-semif.yaml")
    first = render_state_machine(cfg, runner=runner(), config_path="configs/releases/qwen35-4b-semif.yaml")
    second = render_state_machine(cfg, runner=runner(post_promote_wait_s=300),
                                  config_path="configs/releases/qwen35-4b-semif.yaml")
    with mock_aws():
        sfn = boto3.client("stepfunctions", region_name=REGION)
        created = deploy_state_machine(cfg, first, role_arn=ROLE, client=sfn)
        assert created["status"] == "created" and created["name"] == "shiplift-qwen35-4b-semif-release"
        tags = {t["key"]: t["value"] for t in sfn.list_tags_for_resource(resourceArn=created["arn"])["tags"]}
        assert tags == {"shiplift:model": "qwen35-4b-semif", "shiplift:managed": "true"}
        assert deploy_state_machine(cfg, first, role_arn=ROLE, client=sfn) == {**created, "status": "unchanged"}
        updated = deploy_state_machine(cfg, second, role_arn=ROLE, client=sfn)
        assert updated == {**created, "status": "updated"}
        assert json.loads(sfn.describe_state_machine(stateMachineArn=created["arn"])["definition"]) == second
        assert deploy_state_machine(cfg, second, role_arn=ROLE, client=sfn)["status"] == "unchanged"
        assert len(sfn.list_state_machines()["stateMachines"]) == 1


def test_deploy_never_touches_a_state_machine_it_does_not_manage():
    cfg = config("qwen35-4b-semif.yaml")
    definition = render("qwen35-4b-semif.yaml")
    with mock_aws():
        sfn = boto3.client("stepfunctions", region_name=REGION)
        sfn.create_state_machine(name=state_machine_name(cfg),
                                 definition=json.dumps({"StartAt": "A", "States": {"A": {"Type": "Succeed"}}}),
                                 roleArn=ROLE)
        with pytest.raises(Conflict, match="not managed by shiplift"):
            deploy_state_machine(cfg, definition, role_arn=ROLE, client=sfn)
    with pytest.raises(BadInput, match="not an IAM role ARN"):
        deploy_state_machine(cfg, definition, role_arn="shiplift-role", client=object())


def _stubbed(live_definition: dict, live_tags: list[dict], role: str = ROLE):
    client = boto3.client("stepfunctions", region_name=REGION)
    stub = Stubber(client)
    arn = f"arn:aws:states:{REGION}:123456789012:stateMachine:shiplift-qwen35-4b-semif-release"
    stub.add_response("list_state_machines", {"stateMachines": [
        {"stateMachineArn": arn, "name": "shiplift-qwen35-4b-semif-release", "type": "STANDARD", "creationDate": 0}]})
    stub.add_response("list_tags_for_resource", {"tags": live_tags}, {"resourceArn": arn})
    stub.add_response("describe_state_machine", {
        "stateMachineArn": arn, "name": "shiplift-qwen35-4b-semif-release", "definition": json.dumps(live_definition),
        "roleArn": role, "type": "STANDARD", "creationDate": 0}, {"stateMachineArn": arn})
    return client, stub, arn


def test_update_and_tag_requests_match_the_botocore_model():
    """Stubber validates our requests against the service model (moto does not check these shapes)."""
    cfg = config("qwen35-4b-semif.yaml")
    definition = render("qwen35-4b-semif.yaml")
    client, stub, arn = _stubbed({"StartAt": "Old", "States": {"Old": {"Type": "Succeed"}}},
                                 [{"key": "shiplift:managed", "value": "true"}])
    stub.add_response("update_state_machine", {"updateDate": 0},
                      {"stateMachineArn": arn, "definition": definition_json(definition), "roleArn": ROLE})
    stub.add_response("tag_resource", {}, {"resourceArn": arn, "tags": [
        {"key": "shiplift:model", "value": "qwen35-4b-semif"}, {"key": "shiplift:managed", "value": "true"}]})
    with stub:
        assert deploy_state_machine(cfg, definition, role_arn=ROLE, client=client)["status"] == "updated"
        stub.assert_no_pending_responses()


def test_unchanged_deploy_makes_no_changing_call():
    cfg = config("qwen35-4b-semif.yaml")
    definition = render("qwen35-4b-semif.yaml")
    tags = [{"key": "shiplift:model", "value": "qwen35-4b-semif"}, {"key": "shiplift:managed", "value": "true"}]
    client, stub, _ = _stubbed(json.loads(definition_json(definition)), tags)
    with stub:  # any further call (update, tag) would raise: the Stubber has no response queued for it
        assert deploy_state_machine(cfg, definition, role_arn=ROLE, client=client)["status"] == "unchanged"
        stub.assert_no_pending_responses()
    client, stub, arn = _stubbed(json.loads(definition_json(definition)), tags,
                                 role="arn:aws:iam::123456789012:role/old")
    stub.add_response("update_state_machine", {"updateDate": 0},
                      {"stateMachineArn": arn, "definition": definition_json(definition), "roleArn": ROLE})
    with stub:
        assert deploy_state_machine(cfg, definition, role_arn=ROLE, client=client)["status"] == "updated"


# --- the pieces the tasks and the lead's CLI call ------------------------------------------------------


def test_publish_stage_result_writes_the_envelope_the_choice_reads():
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket="shiplift-results")
        written = publish_stage_result("s3://shiplift-results/sfn/r1/validate.json", release_id="r1", stage="validate",
                                       result={"decision": "pass", "metrics": {"accuracy": 0.8}}, client=s3)
        body = json.loads(s3.get_object(Bucket="shiplift-results", Key="sfn/r1/validate.json")["Body"].read())
    assert body == {"release_id": "r1", "stage": "validate",
                    "result": {"decision": "pass", "metrics": {"accuracy": 0.8}}}
    assert written["bytes"] > 0
    with pytest.raises(BadInput, match="not s3://BUCKET/KEY"):
        publish_stage_result("/tmp/validate.json", release_id="r1", stage="validate", result={}, client=object())
    with pytest.raises(BadInput, match="unknown stage"):
        publish_stage_result("s3://b/k", release_id="r1", stage="gate", result={}, client=object())


def test_stage_commands_parse_with_the_cli():
    from shiplift.tasks.cli.main import build_parser
    from shiplift.tasks.orchestrators.step_functions import stage_command

    for stage in STAGES:
        args = build_parser().parse_args(stage_command(stage, "rel-1", PG, "stepfunctions:exec-1")[1:])
        assert (args.name, args.release, args.ledger_url, args.holder) == (stage, "rel-1", PG, "stepfunctions:exec-1")


def test_verify_task_definition_checks_the_pinned_image():
    with mock_aws():
        ecs = boto3.client("ecs", region_name=REGION)

        def register(image: str, name: str = "pipeline") -> str:
            revision = ecs.register_task_definition(
                family="shiplift-pipeline", networkMode="awsvpc", requiresCompatibilities=["FARGATE"], cpu="1024",
                memory="4096",
                containerDefinitions=[{"name": name, "image": image, "essential": True}])["taskDefinition"]["revision"]
            return f"shiplift-pipeline:{revision}"

        good, wrong, other = register(IMAGE), register(IMAGE.replace("a" * 64, "b" * 64)), register(IMAGE,
                                                                                                    name="worker")
        assert verify_task_definition(runner(task_definition=good), client=ecs)["image"] == IMAGE
        with pytest.raises(Conflict, match="not the pinned pipeline image"):
            verify_task_definition(runner(task_definition=wrong), client=ecs)
        with pytest.raises(NotFound, match="no container 'pipeline'"):
            verify_task_definition(runner(task_definition=other), client=ecs)


def test_runner_settings_refuse_bad_input(tmp_path):
    with pytest.raises(ValueError, match="at least one subnet"):
        runner(subnets=[])
    with pytest.raises(ValueError, match="not subnet ids"):
        runner(subnets=["10.0.0.0/24"])
    with pytest.raises(ValueError, match="pattern"):
        runner(pipeline_image="123456789012.dkr.ecr.us-east-1.amazonaws.com/shiplift/pipeline:latest")
    with pytest.raises(ValueError, match="pattern"):
        runner(task_definition="shiplift-pipeline")  # an unpinned family could change under the state machine
    with pytest.raises(ValueError, match="Extra inputs"):
        runner(image="x")
    with pytest.raises(ValueError, match="FARGATE only"):
        runner(launch_type="EC2", platform_version="1.4.0")
    assert runner(launch_type="EC2", subnets=[], security_groups=[]).launch_type == "EC2"
    path = tmp_path / "runner.yaml"
    path.write_text(f"cluster: shiplift\ntask_definition: shiplift-pipeline:3\npipeline_image: {IMAGE}\nsubnets: "
                    "[subnet-0123456789abcdef0]\n")
    assert load_runner_settings(str(path)).state_dir == "/tmp/shiplift"
    path.write_text(f"cluster: shiplift\ntask_definition: shiplift-pipeline:3\npipeline_image: {IMAGE}\nsubnets: "
                    "[]\nspeed: 3\n")
    with pytest.raises(ConfigError, match="speed: Extra inputs"):
        load_runner_settings(str(path))
    with pytest.raises(ConfigError, match="does not exist"):
        load_runner_settings(str(tmp_path / "absent.yaml"))


def test_state_machine_names_fit_80_characters():
    # the longest the config allows
    longest = config("gemma-decision.yaml", "resource_prefix=" + "p" * 16, "name=" + "m" * 30)
    assert len(state_machine_name(longest)) <= 80
    assert state_machine_name(config("gemma-decision.yaml")) == "shiplift-gemma-decision-release"


def test_role_policy_is_scoped_and_accepted_by_iam():
    from shiplift.tasks.orchestrators.step_functions import state_machine_role_policy

    cfg = config("qwen35-4b-semif.yaml")
    policy = state_machine_role_policy(cfg, runner(result_bucket=None), account_id="123456789012", region=REGION)
    resources = [s["Resource"] for s in policy["Statement"]]
    assert "*" not in resources and all(r.startswith("arn:aws:") for r in resources)
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert by_sid["RunPipelineTasks"]["Resource"] == ("arn:aws:ecs:us-east-1:123456789012:"
                                                      "task-definition/shiplift-pipeline:3")
    assert by_sid["PassPipelineRoles"]["Resource"] == "arn:aws:iam::123456789012:role/shiplift-*"
    read = tasks_of(render_state_machine(cfg, runner=runner(result_bucket=None),
                                         config_path="configs/releases/qwen35-4b-semif.yaml"))["ReadGateDecision"]
    key_arn = f"arn:aws:s3:::{read['Parameters']['Bucket']}/{read['Parameters']['Key']}"
    assert fnmatch.fnmatchcase(key_arn,
                               by_sid["ReadStageResults"]["Resource"]), "the role cannot read the result it needs"
    with mock_aws():
        iam = boto3.client("iam", region_name=REGION)
        assert iam.create_policy(PolicyName="shiplift-sfn", PolicyDocument=json.dumps(policy))["Policy"]["Arn"]
    with pytest.raises(BadInput, match="12-digit"):
        state_machine_role_policy(cfg, runner(), account_id="1234", region=REGION)
