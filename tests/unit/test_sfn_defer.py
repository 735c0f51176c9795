"""A deferred stage on Step Functions (issue 48 item 5): deploy_candidate renders as a start task, then a loop of a
short poll task, a read of its answer, a Choice and a Wait, instead of one task that sleeps; moto's interpreter runs the
loop; and the two task commands (`python -m shiplift.tasks.orchestrators.step_functions_defer start|poll`) run on a real
tiny local release, keeping the ledger as a stage run does."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from shiplift.tasks.errors import Conflict, DeployFailed, StepTimedOut, Throttled
from shiplift.tasks.orchestrators.step_functions import (
    DEFERRED_SUFFIXES,
    FAILED_STATE,
    POLL_TASK_S,
    STATE_NAMES,
    definition_json,
)
from shiplift.tasks.orchestrators.step_functions_defer import MODULE, deferred_command, main, parser
from shiplift.tasks.orchestrators.task_token import HEARTBEAT_TIMEOUT, retryable_error_names
from shiplift.tasks.pipeline.release import release_id_for
from shiplift.tasks.pipeline.table import STEPS, timeout_for
from tests.unit.test_sfn import (
    PARSER,
    REGION,
    ROLE,
    _stub_ecs,
    _with_envelope,
    answered,
    aws_env,  # noqa: F401 (the fake credentials every moto test here needs)
    command,
    config,
    entered,
    render,
    runner,
    wait_for,
)

STAGE, EVERY_S = "deploy_candidate", STEPS["deploy_candidate"].defers.every_s
START = STATE_NAMES[STAGE]
POLL, READ, DONE, WAIT, FINISH = (START + suffix for suffix in DEFERRED_SUFFIXES)


def test_a_deferred_stage_is_start_then_a_poll_loop_then_the_stage_itself():
    definition, cfg = render(), config("gemma-decision.yaml")
    states, rid, url = definition["States"], release_id_for(cfg), cfg.backend.ledger_url
    assert states["Image"]["Next"] == START
    assert command(states[START]) == ["python", "-m", MODULE, "start", STAGE, "--release", rid, "--ledger-url", url,
                                      "--holder", "<holder>"]
    assert states[START]["Next"] == POLL and states[POLL]["Next"] == READ and states[READ]["Next"] == DONE
    read = states[READ]["Parameters"]
    assert command(states[POLL]) == ["python", "-m", MODULE, "poll", STAGE, "--release", rid, "--ledger-url", url,
                                     "--holder", "<holder>", "--result-uri", f"s3://{read['Bucket']}/{read['Key']}"]
    assert states[READ]["ResultPath"] == f"$.polls.{STAGE}" and read["Key"].endswith(f"/{rid}/{STAGE}-poll.json")
    assert states[DONE]["Type"] == "Choice" and states[DONE]["Choices"][0]["Next"] == FINISH
    assert states[DONE]["Default"] == WAIT
    assert states[WAIT] == {"Type": "Wait", "Comment": states[WAIT]["Comment"], "Seconds": EVERY_S, "Next": POLL}
    assert command(states[FINISH])[:3] == ["shiplift", "stage", STAGE] and states[FINISH]["Next"] == "Validate"
    # the start and the stage's own run carry the table's policy; the poll is short and retries only a container that
    # never ran or stopped heartbeating: a failure it reports is the stage's, and goes to teardown
    assert states[START]["TimeoutSeconds"] == states[FINISH]["TimeoutSeconds"] == (
        timeout_for(STAGE, cfg) + runner().startup_allowance_s)
    assert states[POLL]["TimeoutSeconds"] == POLL_TASK_S + runner().startup_allowance_s
    retried = {e for rule in states[POLL]["Retry"] for e in rule["ErrorEquals"]}
    assert HEARTBEAT_TIMEOUT in retried and not retried & set(retryable_error_names())
    for name in (START, POLL, READ, FINISH):
        assert states[name]["Catch"][-1]["Next"] == "TeardownAfterFailure", name


def test_the_poll_commands_parse_and_only_a_deferring_stage_is_accepted():
    argv = deferred_command("poll", STAGE, "rel-1", "postgresql://h/l", "stepfunctions:exec-1", "s3://b/k.json")
    args = parser().parse_args(argv[3:])
    assert (args.action, args.stage, args.release, args.ledger_url, args.holder, args.result_uri) == (
        "poll", STAGE, "rel-1", "postgresql://h/l", "stepfunctions:exec-1", "s3://b/k.json")
    with pytest.raises(SystemExit):
        parser().parse_args(["start", "validate", "--release", "r", "--ledger-url", "u", "--holder", "h"])


def _run(definition: dict) -> tuple[str, list[str]]:
    with mock_aws(config=PARSER):
        sfn = boto3.client("stepfunctions", region_name=REGION)
        arn = sfn.create_state_machine(name="defer", definition=definition_json(definition),
                                       roleArn=ROLE)["stateMachineArn"]
        execution = sfn.start_execution(stateMachineArn=arn, input="{}")["executionArn"]
        status = wait_for(sfn, execution, deadline_s=60)["status"]
        return status, [s for s in entered(sfn, execution) if not s.startswith((START + "Count", START + "Answer"))
                        and s != "ParseGateDecision"]


def test_moto_runs_the_loop_until_the_poll_says_done_then_records_the_stage():
    """The poll answers still creating twice, then done: three polls, two waits, then the stage's own task."""
    rid = release_id_for(config("gemma-decision.yaml"))
    stubbed = _with_envelope(answered(_stub_ecs(render()), rid, done_at_poll=3),
                             {"release_id": rid, "stage": "validate", "result": {"decision": "pass"}})
    status, route = _run(stubbed)
    assert status == "SUCCEEDED", route
    deploy = route[route.index(START):route.index("Validate")]
    assert deploy == [START, *[POLL, READ, DONE, WAIT] * 2, POLL, READ, DONE, FINISH]
    assert route[-1] == "Released"


def test_moto_sends_a_failed_poll_and_an_answer_for_another_release_the_right_way():
    """A poll task that fails (the backend's failure, or the stage's timeout: the poll raises both) tears down and
    records the failure; an answer published for another release is no answer: the loop polls again."""
    rid = release_id_for(config("gemma-decision.yaml"))
    failing = answered(_stub_ecs(render(), failing=(POLL,)), rid)
    status, route = _run(failing)
    assert status == "FAILED" and route[route.index(START):] == [START, POLL, "TeardownAfterFailure", "EndFailed",
                                                                   FAILED_STATE]
    other = answered(_stub_ecs(render()), "someone-else-000000000000", done_at_poll=1)
    other["States"][WAIT]["Next"] = "Released"  # stop after the first wait instead of polling for ever
    status, route = _run(other)
    assert route[route.index(START):] == [START, POLL, READ, DONE, WAIT, "Released"]


def test_promote_is_a_loop_too_whose_stage_run_comes_after_the_update_ended():
    """The table defers promote: its start task sends production's update, the poll loop waits it out with no task
    running, and the stage's own task (which judges the update's last step) goes on to the bake or teardown; moto
    runs both loops, deploy_candidate's then promote's."""
    promote = STATE_NAMES["promote"]
    p_poll, p_read, p_done, p_wait, p_finish = (promote + suffix for suffix in DEFERRED_SUFFIXES)
    definition, cfg = render(), config("gemma-decision.yaml")
    states, rid = definition["States"], release_id_for(cfg)
    assert command(states[promote])[:5] == ["python", "-m", MODULE, "start", "promote"]
    assert command(states[p_poll])[:5] == ["python", "-m", MODULE, "poll", "promote"]
    assert states[p_done]["Choices"][0]["Next"] == p_finish and states[p_wait]["Next"] == p_poll
    assert states[p_wait]["Seconds"] == STEPS["promote"].defers.every_s
    assert command(states[p_finish])[:3] == ["shiplift", "stage", "promote"]
    assert states[p_finish]["Next"] in ("Bake", STATE_NAMES["teardown_candidate"])
    assert states["GateDecision"]["Choices"][-1]["Next"] in (promote, "Approval"), "the gate leads to the start"
    stubbed = _with_envelope(answered(_stub_ecs(definition), rid, done_at_poll=2),
                             {"release_id": rid, "stage": "validate", "result": {"decision": "pass"}})
    status, route = _run(stubbed)
    assert status == "SUCCEEDED", route
    route = [s for s in route if not s.startswith((promote + "Count", promote + "Answer"))]
    assert route[route.index(promote):route.index(p_finish) + 1] == [
        promote, p_poll, p_read, p_done, p_wait, p_poll, p_read, p_done, p_finish]
    assert route[-1] == "Released"


# --- the task commands on a real local release ------------------------------------------------------


@pytest.fixture
def imaged(tmp_path, tiny_release):
    """A tiny local release run through image, with its ledger in SQLite: what the start task finds."""
    from shiplift.tasks.pipeline.release import begin_orchestrated, run_orchestrated_stage

    state = tmp_path / "state"
    path = tiny_release.write_tiny_config(tmp_path / "configs", state,
                                          backend__ledger_url=f"sqlite:///{state / 'ledger.db'}")
    quiet = lambda message: None  # noqa: E731
    begun = begin_orchestrated(path, holder="stepfunctions:exec-1", progress=quiet)
    for stage in ("resolve", "build", "package", "image"):
        run_orchestrated_stage(begun["release_id"], stage, holder="stepfunctions:exec-1",
                               ledger_url=begun["ledger_url"], progress=quiet)
    yield begun
    tiny_release.stop_endpoints(state)


def _records(begun: dict) -> list[tuple[str, object]]:
    from shiplift.tasks.backends.registry import open_ledger

    return [(r.event, r.payload.get("deferred") or r.payload.get("error_type"))
            for r in open_ledger(ledger_url=begun["ledger_url"]).release(begun["release_id"]) if r.stage == STAGE]


def test_start_and_poll_tasks_keep_the_ledger_as_a_stage_run_does(imaged, monkeypatch, capsys):
    import shiplift.tasks.pipeline.deferred as deferred
    import shiplift.tasks.pipeline.stages.candidate as candidate
    from shiplift.tasks.backends.interfaces import DeployPoll
    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
    from shiplift.tasks.pipeline.release import run_orchestrated_stage

    rid, url = imaged["release_id"], imaged["ledger_url"]

    def task(action: str) -> int:
        return main([action, STAGE, "--release", rid, "--ledger-url", url, "--holder", "stepfunctions:exec-1"])

    with pytest.raises(Conflict, match="there is no start to poll"):
        task("poll")
    assert task("start") == 0 and _records(imaged) == [("started", True)]
    names = [e["name"] for e in ProcessSupervisor(imaged["state_dir"]).list_endpoints()]
    assert len(names) == 1, f"the start created the candidate endpoint: {names}"
    assert task("poll") == 0 and "'done': True" in capsys.readouterr().err

    # a throttled look is no failure; a poll that finds the stage still creating past its timeout records it failed
    def throttled(ctx):
        raise Throttled("rate exceeded")

    monkeypatch.setattr(candidate, "poll", throttled)
    assert task("poll") == 0 and "'done': False" in capsys.readouterr().err
    assert _records(imaged) == [("started", True)]
    monkeypatch.setattr(candidate, "poll", lambda ctx: DeployPoll(in_service=False, status="endpoint Creating"))
    later = deferred.utcnow() + deferred.timedelta(seconds=timeout_for(STAGE, _config(imaged)) + 1)
    monkeypatch.setattr(deferred, "utcnow", lambda: later)
    with pytest.raises(StepTimedOut, match="still endpoint Creating"):
        task("poll")
    assert _records(imaged)[-1] == ("failed", "StepTimedOut")
    monkeypatch.undo()

    # the retry starts it again; the candidate dies before the poll: DeployFailed, recorded
    assert task("start") == 0 and _records(imaged)[-1] == ("started", True)
    ProcessSupervisor(imaged["state_dir"]).delete_endpoint(names[0])
    with pytest.raises(DeployFailed, match="gone after its start"):
        task("poll")
    assert _records(imaged)[-1] == ("failed", "DeployFailed")

    # started again, polled done, then the stage itself records the result; a start after that starts nothing
    assert task("start") == 0 and task("poll") == 0
    result = run_orchestrated_stage(rid, STAGE, holder="stepfunctions:exec-1", ledger_url=url,
                                    progress=lambda message: None)
    assert result["endpoint"] == names[0] and _records(imaged)[-1] == ("succeeded", None)
    before = _records(imaged)
    assert task("start") == 0 and _records(imaged) == before, "a finished stage is not started again"


def _config(begun: dict):
    from shiplift.tasks.backends.registry import open_ledger
    from shiplift.tasks.config import ReleaseConfig
    from shiplift.tasks.ledger.release_state import ReleaseState

    state = ReleaseState.load(open_ledger(ledger_url=begun["ledger_url"]), begun["release_id"])
    return ReleaseConfig.model_validate(state.opened["config"])


# --- the same start and polls against the AWS double -------------------------------------------------


def _aws_imaged(aws, aws_release, tiny_release, tmp_path, **changes) -> dict:
    from shiplift.tasks.pipeline.release import begin_orchestrated, run_orchestrated_stage

    aws_release.prepare_account(aws)
    path = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state", **changes)
    begun = begin_orchestrated(path, holder="stepfunctions:exec-1", progress=lambda message: None)
    for stage in ("resolve", "build", "package", "image"):
        run_orchestrated_stage(begun["release_id"], stage, holder="stepfunctions:exec-1",
                               ledger_url=begun["ledger_url"], state_dir=begun["state_dir"],
                               progress=lambda message: None)
    return begun


def _deferred(begun: dict, action: str) -> dict:
    import shiplift.tasks.pipeline.deferred as deferred

    call = deferred.start_orchestrated if action == "start" else deferred.poll_orchestrated
    return call(begun["release_id"], STAGE, holder="stepfunctions:exec-1", ledger_url=begun["ledger_url"],
                state_dir=begun["state_dir"], progress=lambda message: None)


def _creates(aws_calls) -> list[str]:
    return [op for _, op, _ in aws_calls if op.startswith("Create") and op not in ("CreateModel",
                                                                                     "CreateEndpointConfig")]


@pytest.mark.parametrize("placement", ["pool", "mig"])
def test_on_sagemaker_the_start_returns_before_in_service_and_the_polls_create_the_component(
        aws, aws_calls, aws_release, tiny_release, tmp_path, placement):
    """The start sends CreateEndpoint and returns (SageMaker answers Creating); each poll is one look (waiters.json's
    acceptors); on a component endpoint (a MIG candidate) the poll that finds the endpoint up creates the component.
    The stage then records its result without creating anything again."""
    from shiplift.tasks.pipeline.release import run_orchestrated_stage
    from tests.aws.test_hosting_aws import MIG

    begun = _aws_imaged(aws, aws_release, tiny_release, tmp_path, **({"placement": MIG} if placement == "mig" else {}))
    aws_calls.clear()
    assert "started" in _deferred(begun, "start") and _creates(aws_calls) == ["CreateEndpoint"]
    answers = []
    while not answers or not answers[-1]["done"]:
        answers.append(_deferred(begun, "poll"))
        assert len(answers) < 10, answers
    statuses = [a["status"] for a in answers]
    assert statuses[0] == "endpoint Creating", statuses
    if placement == "mig":
        assert "inference component Creating" in statuses and statuses[-1] == "inference component InService"
        assert _creates(aws_calls) == ["CreateEndpoint", "CreateInferenceComponent"]
    else:
        assert set(statuses[:-1]) == {"endpoint Creating"} and statuses[-1] == "endpoint InService", statuses
        assert _creates(aws_calls) == ["CreateEndpoint"]
    result = run_orchestrated_stage(begun["release_id"], STAGE, holder="stepfunctions:exec-1",
                                    ledger_url=begun["ledger_url"], state_dir=begun["state_dir"],
                                    progress=lambda message: None)
    assert _creates(aws_calls) == (["CreateEndpoint", "CreateInferenceComponent"] if placement == "mig"
                                   else ["CreateEndpoint"]), "the stage found the work done"
    assert aws.client("sagemaker").describe_endpoint(EndpointName=result["endpoint"])["EndpointStatus"] == "InService"


def test_on_sagemaker_a_failed_endpoint_is_a_failed_poll_and_the_retry_s_start_replaces_it(
        aws, aws_calls, aws_release, tiny_release, tmp_path):
    begun = _aws_imaged(aws, aws_release, tiny_release, tmp_path)
    aws.scenario(fail_next_endpoint_with="The primary container for production variant did not pass the ping health "
                                         "check.")
    _deferred(begun, "start")
    with pytest.raises(DeployFailed, match="did not pass the ping health check"):
        while not _deferred(begun, "poll")["done"]:
            pass
    assert _records(begun)[-1] == ("failed", "DeployFailed")
    aws_calls.clear()
    _deferred(begun, "start")  # what the orchestrator's retry runs
    assert [op for _, op, _ in aws_calls if op in ("DeleteEndpoint", "CreateEndpoint")] == ["DeleteEndpoint",
                                                                                          "CreateEndpoint"]
