"""Approval before production on Step Functions (issue 21): a `.waitForTaskToken` state between the gate and Promote,
and `shiplift approve` / `reject` sending the decision with the token its release's own ledger record names.

What runs where:
- the rendered definition is checked statically against the rules tests/unit/test_sfn.py checks (every path, Retry and
  Catch, the botocore RunTask model) and parsed by moto's ASL parser;
- executions run in moto's Step Functions interpreter (`execute_state_machine`), which implements the callback
  pattern: a `.waitForTaskToken` task waits until SendTaskSuccess/SendTaskFailure with its token, or its TimeoutSeconds
  (https://docs.aws.amazon.com/step-functions/latest/dg/connect-to-resource.html#connect-wait-token). moto's ECS
  integration cannot run RunTask (it passes the ASL's PascalCase parameters to boto3 unconverted: KeyError 'Cluster'),
  so AwaitApproval's RunTask is swapped for an `aws-sdk:s3:putObject.waitForTaskToken` that hands `$$.Task.Token` to
  the test, which then plays the container (`task_token.await_approval`) against a real local release; its Timeout,
  Catch, ResultPath and Next are the rendered ones;
- the decision is sent to moto with SendTaskSuccess
  (https://docs.aws.amazon.com/step-functions/latest/apireference/API_SendTaskSuccess.html); its refusals
  (TaskTimedOut, InvalidToken, TaskDoesNotExist: the operation's errors in botocore's model) are also checked with
  botocore's Stubber, which validates each request against the service model.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
import time
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import Conflict, LeaseLost
from shiplift.tasks.ledger.events import APPROVAL, APPROVED, AWAITING_APPROVAL, REJECTED, TIMED_OUT
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.orchestrators import task_token
from shiplift.tasks.orchestrators.approvals import answer_approval
from shiplift.tasks.orchestrators.step_functions import (
    APPROVAL_STATE,
    APPROVAL_TIMED_OUT_STATE,
    ECS_RUN_TASK,
    FAILED_STATE,
    TEARDOWN_STATES,
    RunnerSettings,
    approval_token_prefix,
    approver_policy,
    definition_json,
    render_state_machine,
)
from shiplift.tasks.orchestrators.task_token import TOKEN_ENV, approval_timed_out, await_approval, send_decision
from shiplift.tasks.pipeline.approval import TOKEN_RENEWED, token_reference, waiting_execution
from shiplift.tasks.pipeline.release import begin_orchestrated, end_orchestrated, release_id_for, run_orchestrated_stage
from shiplift.tasks.pipeline.table import LEASE, STAGES_THROUGH_GATE, timeouts_for
from tests.unit.test_sfn import PROMOTE_LOOP, entered, wait_for  # an execution's end and the states it entered

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/shiplift-stepfunctions"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/shiplift/pipeline@sha256:" + "a" * 64
BUCKET = "shiplift-results"
PARSER = {"stepfunctions": {"execute_state_machine": True}}
PG = "postgresql+psycopg2://shiplift@ledger.internal.example:5432/shiplift"
APPROVERS = ["alice", "bob"]
QUIET = lambda message: None  # noqa: E731


@pytest.fixture(autouse=True)
def aws_env(monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", REGION)):
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)


def runner(**changes) -> RunnerSettings:
    base = dict(cluster="shiplift", task_definition="shiplift-pipeline:3", pipeline_image=IMAGE,
                subnets=["subnet-0123456789abcdef0"], security_groups=["sg-0123456789abcdef0"], result_bucket=BUCKET,
                post_promote_wait_s=1)
    return RunnerSettings(**{**base, **changes})


def shipped(*overrides: str):
    """gemma-decision with a shared ledger, requiring an approval unless told otherwise."""
    approval = ("promotion.approval.required=true", f"promotion.approval.approvers=[{','.join(APPROVERS)}]")
    return load_release_config(ROOT / "configs/releases/gemma-decision.yaml",
                               overrides=(f"backend.ledger_url={PG}", *approval, *overrides), environ={})


def render(config, **runner_changes) -> dict:
    return render_state_machine(config, runner=runner(**runner_changes),
                                config_path="configs/releases/gemma-decision.yaml")


def successors(state: dict) -> list[str]:
    found = [state[k] for k in ("Next", "Default") if k in state]
    return found + [c["Next"] for c in state.get("Choices", [])] + [c["Next"] for c in state.get("Catch", [])]


def paths(definition: dict, start: str | None = None) -> list[list[str]]:
    """Every path to a terminal state; a deferred stage's poll loop is not followed back (`test_sfn.loop_back`)."""
    from tests.unit.test_sfn import loop_back

    states, out = definition["States"], []

    def walk(name: str, seen: list[str]) -> None:
        assert name not in seen, f"cycle through {name}"
        following = successors(states[name])
        if not following:
            out.append(seen + [name])
        for nxt in following:
            if not loop_back(name, nxt):
                walk(nxt, seen + [name])

    walk(start or definition["StartAt"], [])
    return out


def command(state: dict) -> list[str]:
    override = state["Parameters"]["Overrides"]["ContainerOverrides"][0]
    array = override["Command.$"]
    return [literal if literal or not holder else "<holder>"
            for literal, holder in re.findall(r"'([^']*)'|(\$\.run\.holder)", array[len("States.Array("):-1])]


# --- the rendered definition ----------------------------------------------------------------------------------------


def test_a_config_requiring_approval_waits_on_a_task_token_between_the_gate_and_promote():
    config = shipped("promotion.approval.timeout_s=259200")
    definition = render(config, startup_allowance_s=600)
    states, rid = definition["States"], release_id_for(config)
    assert states["GateDecision"]["Choices"][-1] == {"Variable": "$.gate.envelope.result.decision",
                                                     "StringEquals": "pass", "Next": APPROVAL_STATE}
    wait = states[APPROVAL_STATE]
    assert wait["Resource"] == ECS_RUN_TASK == "arn:aws:states:::ecs:runTask.waitForTaskToken"
    override = wait["Parameters"]["Overrides"]["ContainerOverrides"][0]
    assert {"Name": TOKEN_ENV, "Value.$": "$$.Task.Token"} in override["Environment"], "the container gets the token"
    assert command(wait) == ["shiplift", "orchestrate", "await-approval", "--release", rid, "--ledger-url", PG,
                             "--holder", "<holder>", "--token-prefix",
                             f"s3://{BUCKET}/shiplift/stepfunctions/{rid}/approval"]
    # the wait follows approval.timeout_s (+ the ECS start-up allowance once), and no heartbeat: nothing beats while a
    # person reads the report (the States Language wants HeartbeatSeconds below TimeoutSeconds anyway)
    assert wait["TimeoutSeconds"] == 259200 + 600 and "HeartbeatSeconds" not in wait
    assert wait["ResultPath"] == "$.approval" and wait["Next"] == "Promote"
    assert wait["Catch"] == [{"ErrorEquals": ["States.Timeout"], "ResultPath": "$.approval_timeout",
                              "Next": APPROVAL_TIMED_OUT_STATE},
                             {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "TeardownAfterFailure"}]
    assert "States.HeartbeatTimeout" not in {e for rule in wait["Retry"] for e in rule["ErrorEquals"]}
    timed_out = states[APPROVAL_TIMED_OUT_STATE]
    assert command(timed_out) == ["shiplift", "orchestrate", "approval-timed-out", "--release", rid, "--ledger-url", PG,
                                  "--holder", "<holder>"]
    assert timed_out["Next"] == "Promote" and timed_out["HeartbeatSeconds"] < timed_out["TimeoutSeconds"]
    assert command(states["Begin"])[-1] == "--waits-for-approval", "begin accepts the config: this machine can wait"
    assert render(shipped("promotion.approval.timeout_s=0.5"))["States"][APPROVAL_STATE]["TimeoutSeconds"] == (
        math.ceil(0.5) + 900), "whole seconds, never 0"

    plain = render(load_release_config(ROOT / "configs/releases/gemma-decision.yaml",
                                       overrides=(f"backend.ledger_url={PG}",), environ={}))
    assert APPROVAL_STATE not in plain["States"] and "--waits-for-approval" not in command(plain["States"]["Begin"])
    assert plain["States"]["GateDecision"]["Choices"][-1]["Next"] == "Promote"


def test_the_approval_graph_keeps_every_rule_and_moto_parses_it():
    definition = render(shipped())
    states = definition["States"]
    all_paths = paths(definition)
    assert {p[-1] for p in all_paths} == {"Released", FAILED_STATE, "BeginFailed", "EndNotRecorded"}
    from tests.unit.test_sfn import reachable

    assert reachable(definition) == set(states), "every state is reachable"
    for path in all_paths:
        if path[-1] != "BeginFailed":
            assert any(s in TEARDOWN_STATES for s in path), f"reaches {path[-1]} without a teardown: {path}"
        if path[-1] == FAILED_STATE:
            assert "EndFailed" in path
        if "Promote" in path:
            assert APPROVAL_STATE in path[:path.index("Promote")], f"Promote reached without the approval: {path}"
    waited = [p for p in all_paths if p[-1] == "Released" and "Promote" in p]
    assert {tuple(p[p.index(APPROVAL_STATE):p.index("Promote") + 1]) for p in waited} == {
        (APPROVAL_STATE, "Promote"), (APPROVAL_STATE, APPROVAL_TIMED_OUT_STATE, "Promote")}
    for name, state in states.items():
        if state["Type"] != "Task":
            continue
        assert state["Catch"][-1]["ErrorEquals"] == ["States.ALL"], name
        for rule in state["Retry"] + state["Catch"]:
            assert "States.ALL" not in rule["ErrorEquals"] or rule["ErrorEquals"] == ["States.ALL"]
        assert all(p[0] in ("TeardownAfterFailure", APPROVAL_TIMED_OUT_STATE, "EndFailed", FAILED_STATE,
                            "EndNotRecorded",
                            "BeginFailed") for c in state["Catch"] for p in paths(definition, c["Next"])), name
        if "HeartbeatSeconds" in state:
            assert state["HeartbeatSeconds"] < state["TimeoutSeconds"], name
    with mock_aws(config=PARSER):
        sfn = boto3.client("stepfunctions", region_name=REGION)
        assert sfn.create_state_machine(name="approval", definition=definition_json(definition),
                                        roleArn=ROLE)["stateMachineArn"]


def test_an_inconclusive_gate_the_release_asks_about_waits_for_the_approval_too():
    """validate's result says an inconclusive gate was asked (`inconclusive.outcome == "asked"`, with
    validation.inconclusive.choice ask): GateDecision sends it to AwaitApproval like a pass; blocked, or a result
    without the field, tears down. Routes run in moto's interpreter with the ECS tasks as Pass states."""
    from tests.unit.test_sfn import _stub_ecs, _with_envelope, answered

    config = shipped('validation.inconclusive={"choice": "ask"}')  # the shipped config extends: ask replaces it
    definition = render(config)
    rid, states = release_id_for(config), definition["States"]
    rules = states["GateDecision"]["Choices"]
    outcome = "$.gate.envelope.result.inconclusive.outcome"
    assert rules[-2] == {"And": [{"Variable": "$.gate.envelope.result.decision", "StringEquals": "inconclusive"},
                                 {"Variable": outcome, "IsPresent": True},
                                 {"Variable": outcome, "StringEquals": "asked"}], "Next": APPROVAL_STATE}
    assert rules[-1]["Next"] == APPROVAL_STATE and states["GateDecision"]["Default"] == "TeardownCandidate"
    for path in paths(definition):
        if "Promote" in path:
            assert APPROVAL_STATE in path[:path.index("Promote")], f"Promote reached without the approval: {path}"
    assert not any("And" in rule for rule in render(shipped())["States"]["GateDecision"]["Choices"]), \
        "a release that does not ask keeps the pass-only Choice"

    results = {"asked": {"decision": "inconclusive", "inconclusive": {"choice": "ask", "outcome": "asked"}},
               "blocked": {"decision": "inconclusive", "inconclusive": {"choice": "block", "outcome": "blocked"}},
               "unrecorded": {"decision": "inconclusive", "inconclusive": None},
               "failed": {"decision": "fail"}}
    routes = {}
    with mock_aws(config=PARSER):
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        sfn = boto3.client("stepfunctions", region_name=REGION)
        for case, result in results.items():
            stubbed = _with_envelope(answered(_stub_ecs(definition), rid),
                                     {"release_id": rid, "stage": "validate", "result": result})
            arn = sfn.create_state_machine(name=f"asked-{case}", definition=definition_json(stubbed),
                                           roleArn=ROLE)["stateMachineArn"]
            execution = sfn.start_execution(stateMachineArn=arn, input="{}")["executionArn"]
            assert wait_for(sfn, execution)["status"] == "SUCCEEDED", case
            route = entered(sfn, execution)
            routes[case] = route[route.index("GateDecision") + 1:]
    assert routes["asked"] == [APPROVAL_STATE, *PROMOTE_LOOP, "Bake", "TeardownCandidate", "EndSucceeded",
                               "Released"]
    for case in ("blocked", "unrecorded", "failed"):
        assert routes[case] == ["TeardownCandidate", "EndSucceeded", "Released"], case


def _camel(value):
    if isinstance(value, list):
        return [_camel(v) for v in value]
    if not isinstance(value, dict):
        return value
    return {(k[:-2] if k.endswith(".$") else k)[0].lower() + (k[:-2] if k.endswith(".$") else k)[1:]:
            (["x"] if k == "Command.$" else "x") if k.endswith(".$") else _camel(v) for k, v in value.items()}


def test_the_approval_tasks_validate_against_the_botocore_run_task_model():
    from botocore.session import get_session
    from botocore.validate import validate_parameters

    run_task = get_session().get_service_model("ecs").operation_model("RunTask").input_shape
    states = render(shipped())["States"]
    for name in (APPROVAL_STATE, APPROVAL_TIMED_OUT_STATE):
        validate_parameters(_camel(states[name]["Parameters"]), run_task)


def test_the_approval_commands_parse_with_the_cli():
    """`shiplift orchestrate await-approval`, `approval-timed-out` and `begin --waits-for-approval` are wired in
    tasks/cli/main.py (tasks.orchestrators.task_token.await_approval / approval_timed_out)."""
    from shiplift.tasks.cli.main import build_parser

    states = render(shipped())["States"]
    parser = build_parser()
    for name in ("Begin", APPROVAL_STATE, APPROVAL_TIMED_OUT_STATE):
        args = parser.parse_args(shlex.split(states[name]["Comment"].replace("<holder>", "stepfunctions:exec-1"))[1:])
        assert args.func.__name__.startswith("cmd_"), name
        assert args.holder == "stepfunctions:exec-1"


def test_the_approver_policy_is_scoped_to_the_tokens_and_accepted_by_iam():
    import fnmatch

    config = shipped()
    policy = approver_policy(config, runner(), account_id="123456789012", region=REGION)
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    token_key = f"arn:aws:s3:::{BUCKET}/shiplift/stepfunctions/{release_id_for(config)}/approval/task-token-0123.json"
    assert fnmatch.fnmatchcase(token_key, by_sid["ReadApprovalTaskTokens"]["Resource"])
    stage_result = f"arn:aws:s3:::{BUCKET}/shiplift/stepfunctions/{release_id_for(config)}/validate.json"
    assert not fnmatch.fnmatchcase(stage_result, by_sid["ReadApprovalTaskTokens"]["Resource"]), "not the stage results"
    assert by_sid["SendTheDecision"]["Action"] == "states:SendTaskSuccess"
    with mock_aws():
        assert boto3.client("iam", region_name=REGION).create_policy(
            PolicyName="shiplift-approver", PolicyDocument=json.dumps(policy))["Policy"]["Arn"]


# --- executions: the test plays AwaitApproval's container against a real local release ------------------------------


def tiny_config(tiny_release, folder: Path, **approval) -> tuple[Path, object, str]:
    state = folder / "state"
    state.mkdir(parents=True, exist_ok=True)
    path = tiny_release.write_tiny_config(folder, state, backend__ledger_url=f"sqlite:///{state / 'ledger.db'}",
                                          promotion__approval={"required": True, "approvers": APPROVERS,
                                                               "timeout_s": 3600, **approval})
    config = load_release_config(path)
    return path, config, f"sqlite:///{state / 'ledger.db'}"


def with_handoff(definition: dict, release_id: str, handoff: str) -> dict:
    """The ECS tasks become Pass states (moto cannot run RunTask), the gate reads pass, and AwaitApproval's RunTask is
    an S3 write of `$$.Task.Token` with the same callback pattern (`.waitForTaskToken`), so the test gets the token
    the container would; Timeout, Catch, ResultPath and Next stay the rendered ones."""
    definition = copy.deepcopy(definition)
    for name, state in list(definition["States"].items()):
        if state.get("Resource") != ECS_RUN_TASK:
            continue
        if name == APPROVAL_STATE:
            state.update(Resource="arn:aws:states:::aws-sdk:s3:putObject.waitForTaskToken",
                         Parameters={"Bucket": BUCKET, "Key": handoff, "Body.$": "$$.Task.Token"})
            state.pop("Retry")
        else:
            definition["States"][name] = {"Type": "Pass", **{k: state[k] for k in ("Next", "ResultPath") if k in state}}
    definition["States"]["ReadGateDecision"] = {
        "Type": "Pass",
        "Result": {"envelope": {"release_id": release_id, "stage": "validate", "result": {"decision": "pass"}}},
        "ResultPath": "$.gate", "Next": "GateDecision"}
    from tests.unit.test_sfn import answered

    return answered(definition, release_id)


def start(sfn, s3, definition: dict, name: str, handoff: str) -> tuple[str, str]:
    """Create and start the machine; returns (execution ARN, the token AwaitApproval waits on)."""
    arn = sfn.create_state_machine(name=name, definition=definition_json(definition), roleArn=ROLE)["stateMachineArn"]
    execution = sfn.start_execution(stateMachineArn=arn, name=f"{name}-run-1", input="{}")["executionArn"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            return execution, s3.get_object(Bucket=BUCKET, Key=handoff)["Body"].read().decode()
        except s3.exceptions.NoSuchKey:
            time.sleep(0.05)
    raise AssertionError(f"{execution} never reached {APPROVAL_STATE}")


def gated(path: Path, config, url: str, holder: str) -> str:
    """What the execution's Begin and stage tasks do up to the gate: open the release, take the lease, run the
    stages."""
    begun = begin_orchestrated(path, holder=holder, allowed_timeouts=timeouts_for(config), actor=holder, progress=QUIET,
                               waits_for_approval=True)
    for stage in STAGES_THROUGH_GATE:
        run_orchestrated_stage(begun["release_id"], stage, holder=holder, ledger_url=url, actor=holder, progress=QUIET)
    return begun["release_id"]


def play_await(monkeypatch, token: str, release_id: str, holder: str, url: str, prefix: str, sfn) -> dict:
    """AwaitApproval's container: the token in its environment, the command the state runs."""
    monkeypatch.setenv(TOKEN_ENV, token)
    try:
        return await_approval(release_id, holder=holder, token_prefix=prefix, ledger_url=url, actor=holder,
                              progress=QUIET, client=sfn)
    finally:
        monkeypatch.delenv(TOKEN_ENV)


def finish_like_the_execution(release_id: str, url: str, holder: str) -> dict:
    """Promote, TeardownCandidate and EndSucceeded, as the execution's tasks run them after AwaitApproval."""
    for stage in ("promote", "teardown_candidate"):
        run_orchestrated_stage(release_id, stage, holder=holder, ledger_url=url, actor=holder, progress=QUIET)
    return end_orchestrated(release_id, holder=holder, failed=False, ledger_url=url, actor=holder, progress=QUIET)


def holds(ledger: Ledger, model: str, holder: str, release_id: str) -> bool:
    try:
        ledger.renew_lease(model, holder, release_id, LEASE.ttl_s)
    except LeaseLost:
        return False
    return True


@pytest.fixture
def account(tiny_release, tmp_path):
    """A factory of one waiting-release story inside moto: (path, config, ledger url, release id, ledger, token prefix,
    s3, stepfunctions), with the bucket AwaitApproval's stand-in writes its token to; `approval` overrides the config's
    promotion.approval."""
    with mock_aws(config=PARSER):
        s3, sfn = boto3.client("s3", region_name=REGION), boto3.client("stepfunctions", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)

        def story(**approval):
            path, config, url = tiny_config(tiny_release, tmp_path, **approval)
            rid = release_id_for(config)
            return path, config, url, rid, Ledger(url), approval_token_prefix(config, runner(), rid), s3, sfn

        yield story


def test_an_approval_is_sent_with_the_stored_token_and_the_execution_promotes(account, monkeypatch):
    path, config, url, rid, ledger, prefix, s3, sfn = account()
    definition = render_state_machine(config, runner=runner(), config_path="configs/releases/tiny-decision.yaml")
    execution, token = start(sfn, s3, with_handoff(definition, rid, "handoff/approve"), "approve", "handoff/approve")
    holder = f"stepfunctions:{execution}"
    assert gated(path, config, url, holder) == rid

    waiting = play_await(monkeypatch, token, rid, holder, url, prefix, sfn)
    assert waiting["decision"] == "awaiting" and sfn.describe_execution(executionArn=execution)["status"] == "RUNNING"
    records = ledger.release(rid)
    [request] = [r for r in records if (r.stage, r.event) == (APPROVAL, AWAITING_APPROVAL)]
    reference = request.payload["step_functions"]
    assert reference["holder"] == holder and reference["execution"] == execution
    assert reference["token_sha256"] == task_token._sha256(token) and waiting_execution(records) == reference
    assert token not in json.dumps([r.payload for r in records]), "the token itself never goes into the ledger"
    bucket, key = reference["token_uri"][len("s3://"):].split("/", 1)
    assert bucket == BUCKET and key.startswith(prefix.split("/", 3)[3] + "/task-token-")
    assert json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())["task_token"] == token
    assert [r.stage for r in records if r.seq > request.seq][:2] == ["teardown_candidate"] * 2, "torn down to wait"
    assert not holds(ledger, config.name, holder, rid), "the lease is given back while a person reads the report"

    # a retried attempt of the state waits on a new token: recorded once, the request stays the same
    play_await(monkeypatch, token, rid, holder, url, prefix, sfn)
    assert [r.event for r in ledger.release(rid) if r.stage == APPROVAL] == [AWAITING_APPROVAL]

    size = len(ledger.history())
    original = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps({**json.loads(original), "task_token": "forged-token"}))
    with pytest.raises(Conflict, match="is not the one release .* names .*another token"):
        answer_approval(rid, approve=True, reason="looks fine", actor="bob", ledger_url=url, progress=QUIET)
    s3.put_object(Bucket=bucket, Key=key, Body=original)
    with pytest.raises(Conflict, match="not an approver"):
        answer_approval(rid, approve=True, reason="looks fine", actor="mallory", ledger_url=url, progress=QUIET)
    assert len(ledger.history()) == size, "refusals record nothing"
    assert sfn.describe_execution(executionArn=execution)["status"] == "RUNNING", "and send nothing"
    assert not holds(ledger, config.name, holder, rid), "nor keep the lease"

    answered = answer_approval(rid, approve=True, reason="gate report read", actor="bob", ledger_url=url,
                               progress=QUIET)
    assert answered["decision"] == APPROVED and answered["by"] == "bob"
    assert answered["step_functions"] == {"execution": execution, "sent": "SendTaskSuccess", "output": {
        "release_id": rid, "decision": "approved", "by": "bob", "seq": answered["step_functions"]["output"]["seq"]}}
    assert answered["summary"]["status"] == "running" and answered["summary"]["stages"]["promote"] == "pending"
    done = wait_for(sfn, execution)
    assert done["status"] == "SUCCEEDED" and json.loads(done["output"])["approval"]["decision"] == "approved"
    route = entered(sfn, execution)
    assert route[route.index(APPROVAL_STATE):] == [APPROVAL_STATE, *PROMOTE_LOOP, "Bake", "TeardownCandidate",
                                                   "EndSucceeded", "Released"]
    assert holds(ledger, config.name, holder, rid), "the execution has its lease back for Promote"

    summary = finish_like_the_execution(rid, url, holder)
    assert summary["status"] == "promoted"
    assert ledger.served_at(config.name, "2100-01-01T00:00:00Z").release_id == rid

    # replays: a second decision is refused before anything is sent; the used token is refused by Step Functions
    with pytest.raises(Conflict, match="already approved"):
        answer_approval(rid, approve=True, reason="again", actor="alice", ledger_url=url, progress=QUIET)
    with pytest.raises(Conflict, match="refused the task token: InvalidToken"):
        send_decision(task_token.approval_aws(config), token, {"decision": "approved"})
    assert ledger.verify().ok


def test_a_rejection_is_sent_as_a_decision_and_promote_skips(account, monkeypatch):
    path, config, url, rid, ledger, prefix, s3, sfn = account()
    definition = render_state_machine(config, runner=runner(post_promote_wait_s=0),
                                      config_path="configs/releases/tiny-decision.yaml")
    execution, token = start(sfn, s3, with_handoff(definition, rid, "handoff/reject"), "reject", "handoff/reject")
    holder = f"stepfunctions:{execution}"
    gated(path, config, url, holder)
    play_await(monkeypatch, token, rid, holder, url, prefix, sfn)

    answered = answer_approval(rid, approve=False, reason="ECE too high for us", actor="alice", ledger_url=url,
                               progress=QUIET)
    assert answered["decision"] == REJECTED and answered["step_functions"]["output"]["decision"] == "rejected"
    done = wait_for(sfn, execution)
    assert done["status"] == "SUCCEEDED", "a rejection is a decision, not a failure"
    route = entered(sfn, execution)
    assert route[route.index(APPROVAL_STATE):] == [APPROVAL_STATE, *PROMOTE_LOOP, "TeardownCandidate",
                                                   "EndSucceeded", "Released"]
    summary = finish_like_the_execution(rid, url, holder)
    assert summary["status"] == "rejected" and summary["rollout"]["reason"] == "not approved: ECE too high for us"
    assert ledger.served_at(config.name, "2100-01-01T00:00:00Z") is None, "nothing reached production"


def test_a_timeout_records_timed_out_and_the_release_ends_rejected(account, monkeypatch):
    path, config, url, rid, ledger, prefix, s3, sfn = account(timeout_s=1)
    definition = render_state_machine(config, runner=runner(startup_allowance_s=0, post_promote_wait_s=0),
                                      config_path="configs/releases/tiny-decision.yaml")
    assert definition["States"][APPROVAL_STATE]["TimeoutSeconds"] == 1
    execution, token = start(sfn, s3, with_handoff(definition, rid, "handoff/timeout"), "timeout", "handoff/timeout")
    done = wait_for(sfn, execution)
    assert done["status"] == "SUCCEEDED"
    route = entered(sfn, execution)
    assert route[route.index(APPROVAL_STATE):] == [APPROVAL_STATE, APPROVAL_TIMED_OUT_STATE, *PROMOTE_LOOP,
                                                   "TeardownCandidate", "EndSucceeded", "Released"]
    events = sfn.get_execution_history(executionArn=execution)["events"]
    assert any(e["type"] == "TaskTimedOut" for e in events)
    with pytest.raises(Conflict, match="TaskTimedOut|InvalidToken"):
        send_decision(task_token.approval_aws(config), token, {"decision": "approved"})  # too late: the state closed

    holder = f"stepfunctions:{execution}"
    gated(path, config, url, holder)
    play_await(monkeypatch, token, rid, holder, url, prefix, sfn)
    timed_out = approval_timed_out(rid, holder=holder, ledger_url=url, actor=holder, progress=QUIET)
    assert timed_out["decision"] == TIMED_OUT and holds(ledger, config.name, holder, rid)
    summary = finish_like_the_execution(rid, url, holder)
    assert summary["status"] == "rejected" and summary["rollout"]["reason"].startswith("not approved: Step Functions "
                                                                                       "stopped waiting")
    assert [r.event for r in ledger.release(rid) if r.stage == APPROVAL] == [AWAITING_APPROVAL, TIMED_OUT]
    with pytest.raises(Conflict, match="already timed_out"):
        answer_approval(rid, approve=True, reason="sorry, late", actor="bob", ledger_url=url, progress=QUIET)


def stopped_while_waiting(definition: dict) -> dict:
    """The execution is stopped while AwaitApproval waits (StopExecution closes its token). moto's StopExecution does
    not interrupt a task waiting on a callback, so the stand-in is a 1 s wait that ends the execution (a Fail state),
    without any step of ours running."""
    definition["States"][APPROVAL_STATE].update(
        TimeoutSeconds=1,
        Catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "StoppedByAnOperator"}])
    definition["States"]["StoppedByAnOperator"] = {"Type": "Fail", "Error": "States.Aborted"}
    return definition


def test_a_decision_whose_execution_stopped_is_recorded_and_the_timeout_step_follows_the_ledger(account, monkeypatch):
    path, config, url, rid, ledger, prefix, s3, sfn = account()
    definition = render_state_machine(config, runner=runner(), config_path="configs/releases/tiny-decision.yaml")
    execution, token = start(sfn, s3, stopped_while_waiting(with_handoff(definition, rid, "handoff/stopped")),
                             "stopped", "handoff/stopped")
    holder = f"stepfunctions:{execution}"
    gated(path, config, url, holder)
    play_await(monkeypatch, token, rid, holder, url, prefix, sfn)
    assert wait_for(sfn, execution)["status"] == "FAILED"
    with pytest.raises(Conflict,
                       match=r"approved decision on .* is recorded, but .* was not told: Step Functions refused"):
        answer_approval(rid, approve=True, reason="gate report read", actor="bob", ledger_url=url, progress=QUIET)
    assert [r.event for r in ledger.release(rid) if r.stage == APPROVAL] == [AWAITING_APPROVAL, APPROVED]
    assert not holds(ledger, config.name, holder, rid), "the lease is not kept for an execution that was not told"

    # a new execution of the same release: AwaitApproval finds the decision and reports it at once
    again, new_token = start(sfn, s3, with_handoff(definition, rid, "handoff/again"), "again", "handoff/again")
    holder = f"stepfunctions:{again}"
    begin_orchestrated(path, holder=holder, allowed_timeouts=timeouts_for(config), actor=holder, progress=QUIET,
                       waits_for_approval=True)
    reported = play_await(monkeypatch, new_token, rid, holder, url, prefix, sfn)
    assert reported["decision"] == "approved"
    assert wait_for(sfn, again)["status"] == "SUCCEEDED"
    assert token_reference(ledger.release(rid))["holder"] == f"stepfunctions:{execution}", "nothing new to wait on"
    assert approval_timed_out(rid, holder=holder, ledger_url=url, actor=holder,
                              progress=QUIET)["decision"] == "approved"
    assert finish_like_the_execution(rid, url, holder)["status"] == "promoted"


def test_a_new_execution_of_a_waiting_release_records_its_new_token(account, monkeypatch):
    path, config, url, rid, ledger, prefix, s3, sfn = account()
    definition = render_state_machine(config, runner=runner(), config_path="configs/releases/tiny-decision.yaml")
    first, old_token = start(sfn, s3, stopped_while_waiting(with_handoff(definition, rid, "handoff/first")), "first",
                             "handoff/first")
    gated(path, config, url, f"stepfunctions:{first}")
    play_await(monkeypatch, old_token, rid, f"stepfunctions:{first}", url, prefix, sfn)
    assert wait_for(sfn, first)["status"] == "FAILED"
    second, new_token = start(sfn, s3, with_handoff(definition, rid, "handoff/second"), "second", "handoff/second")
    holder = f"stepfunctions:{second}"
    begin_orchestrated(path, holder=holder, allowed_timeouts=timeouts_for(config), actor=holder, progress=QUIET,
                       waits_for_approval=True)
    assert play_await(monkeypatch, new_token, rid, holder, url, prefix, sfn)["decision"] == "awaiting"
    records = ledger.release(rid)
    assert [r.event for r in records if r.stage == APPROVAL] == [AWAITING_APPROVAL, TOKEN_RENEWED]
    assert waiting_execution(records)["execution"] == second
    answered = answer_approval(rid, approve=True, reason="ok", actor="alice", ledger_url=url, progress=QUIET)
    assert answered["step_functions"]["execution"] == second
    assert wait_for(sfn, second)["status"] == "SUCCEEDED"
    assert finish_like_the_execution(rid, url, holder)["status"] == "promoted"


# --- the calls, against botocore's Step Functions model ---------------------------------------------------------------


def _stubbed_aws():
    from shiplift.tasks.backends.aws.session import Aws

    client = boto3.client("stepfunctions", region_name=REGION)
    aws = Aws(region=REGION)
    aws.client = lambda service, **_: client  # the session's validation and error mapping, a stubbed client
    return aws, Stubber(client)


@pytest.mark.parametrize("code", ["TaskTimedOut", "InvalidToken", "TaskDoesNotExist"])
def test_a_token_step_functions_no_longer_waits_on_is_refused_by_name(code):
    aws, stub = _stubbed_aws()
    stub.add_client_error("send_task_success", service_error_code=code, service_message="closed",
                          expected_params={"taskToken": "t" * 40, "output": '{"decision": "approved"}'})
    with stub, pytest.raises(Conflict, match=f"refused the task token: {code}: "):
        send_decision(aws, "t" * 40, {"decision": "approved"})
    model = boto3.client("stepfunctions", region_name=REGION).meta.service_model
    assert code in {e.name for e in model.operation_model("SendTaskSuccess").error_shapes}, "an error the API names"


def test_await_approval_reports_a_failure_with_its_token_and_needs_one(monkeypatch, tmp_path):
    from shiplift.tasks.errors import ConfigError, ShipliftError
    from shiplift.tasks.pipeline.release import reopen_release

    client = boto3.client("stepfunctions", region_name=REGION)
    stub = Stubber(client)
    with pytest.raises(ConfigError, match="no task token"):
        await_approval("absent-0123456789ab", holder="stepfunctions:x", token_prefix=f"s3://{BUCKET}/p", client=client)
    with pytest.raises(ShipliftError) as expected:  # what the step meets: a release this ledger never saw
        reopen_release("absent-0123456789ab", state_dir=tmp_path, progress=QUIET)
    monkeypatch.setenv(TOKEN_ENV, "t" * 40)
    stub.add_response("send_task_failure", {}, {"taskToken": "t" * 40, "error": task_token.error_name(expected.value),
                                                "cause": str(expected.value)})
    with stub, pytest.raises(type(expected.value)):
        await_approval("absent-0123456789ab", holder="stepfunctions:x", token_prefix=f"s3://{BUCKET}/p",
                       state_dir=tmp_path, client=client, progress=QUIET)
    stub.assert_no_pending_responses()
