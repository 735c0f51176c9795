"""The release as an AWS Step Functions state machine (DESIGN §11).

Every Task state runs ONE stage of the same code in the pipeline image on ECS (RunTask
`.waitForTaskToken`, Fargate by default): `shiplift stage NAME --release ID --ledger-url URL`, which
returns the recorded result of a stage that already succeeded, so a Retry never duplicates work.
The command reports its own outcome with the task token (`tasks.orchestrators.task_token`): Retry
names exactly the retryable error classes, and every other failure goes straight to teardown.
Tasks share nothing but the ledger (the release's state) and the artifact store (files a later
stage needs), so no shared file system is mounted. Retries and timeouts come from the stage table
(`tasks.pipeline.table`), as the CLI's and Airflow's do. The validate task also publishes its result
to S3 (`--result-uri`) and an `aws-sdk:s3:getObject` state reads it back for the Choice on the gate
decision. A config that requires an approval (`promotion.approval`) waits between the gate and Promote in
`AwaitApproval` (after a pass, or after an inconclusive gate whose release asks a person to decide it,
`validation.inconclusive.choice: ask`): its task records the request with a reference to its task token and exits
without reporting, so the state waits until `shiplift approve` / `shiplift reject` sends the decision with that token
(TimeoutSeconds from `approval.timeout_s`; a timeout records `timed_out` in `ApprovalTimedOut`, and Promote then skips).
docs/step-functions.md explains the choices.

The parts: `step_functions_runner` (the runner settings), `step_functions_tasks` (names, argv and result places of the
Task states, and the result publish), `step_functions_deploy` (the definition's JSON, deploy, the task definition
check) and `step_functions_policies` (IAM); this module renders the ASL and keeps every public name importable here.
"""

from __future__ import annotations

import re
from typing import Any

from shiplift.tasks.config import ReleaseConfig
from shiplift.tasks.errors import BadInput, ConfigError, Conflict
from shiplift.tasks.ledger.events import STAGES
from shiplift.tasks.orchestrators.step_functions_defer import deferred_command
from shiplift.tasks.orchestrators.step_functions_deploy import (
    definition_json,
    deploy_state_machine,
    verify_task_definition,
)
from shiplift.tasks.orchestrators.step_functions_policies import approver_policy, state_machine_role_policy
from shiplift.tasks.orchestrators.step_functions_runner import RunnerSettings, load_runner_settings
from shiplift.tasks.orchestrators.step_functions_tasks import (
    approval_timed_out_command,
    approval_token_prefix,
    await_approval_command,
    begin_command,
    end_command,
    publish_stage_result,
    result_uri,
    stage_command,
    state_machine_name,
)
from shiplift.tasks.orchestrators.task_token import (
    HEARTBEAT_EVERY_S,
    HEARTBEAT_TIMEOUT,
    TOKEN_ENV,
    retryable_error_names,
)
from shiplift.tasks.pipeline.release import release_id_for
from shiplift.tasks.pipeline.table import (
    APPROVAL,
    APPROVAL_DECISION,
    APPROVAL_REQUEST,
    BACKOFF,
    READ_GATE,
    STAGES_THROUGH_GATE,
    STEPS,
    check_timeouts,
    timeout_for,
    timeouts_for,
)

__all__ = [  # importers name these from tasks.orchestrators.step_functions
    "APPROVAL_STATE", "APPROVAL_TIMED_OUT_STATE", "ECS_INFRA_ERRORS", "ECS_RUN_TASK", "FAILED_STATE", "STATE_NAMES",
    "TEARDOWN_STATES", "RunnerSettings", "approval_token_prefix", "approver_policy", "definition_json",
    "deploy_state_machine", "load_runner_settings", "publish_stage_result", "render_state_machine", "stage_command",
    "state_machine_name", "state_machine_role_policy", "verify_task_definition",
]

ECS_RUN_TASK = "arn:aws:states:::ecs:runTask.waitForTaskToken"
S3_GET_OBJECT = "arn:aws:states:::aws-sdk:s3:getObject"

# Errors that mean the container never ran (no capacity, throttled or failed RunTask): always
# safe to retry. `AmazonECS.Unknown` is what RunTask raises when the response carries `Failures`
# (e.g. "Capacity is unavailable at this time"); `ECS.*` are RunTask API exceptions.
ECS_INFRA_ERRORS = ("AmazonECS.Unknown", "ECS.AmazonECSException", "ECS.ServerException", "ECS.LimitExceededException")
STATE_NAMES = {stage: "".join(part.title() for part in stage.split("_")) for stage in STAGES}
TEARDOWN_STATES = ("TeardownCandidate", "TeardownAfterFailure")
FAILED_STATE, BEGIN_FAILED_STATE, END_NOT_RECORDED_STATE = "ReleaseFailed", "BeginFailed", "EndNotRecorded"
APPROVAL_STATE, APPROVAL_TIMED_OUT_STATE = "AwaitApproval", "ApprovalTimedOut"
APPROVAL_RESULT_PATH = "$.approval"  # what `shiplift approve` / `reject` sends with the token: decision, by, seq
# A deferred stage's poll task: one describe, so its own bound is short (plus the ECS start-up allowance).
POLL_TASK_S = 5 * 60
# The states of a deferred stage besides its start (STATE_NAMES[stage]): STATE_NAMES[stage] + each suffix.
DEFERRED_SUFFIXES = ("Poll", "ReadPoll", "Done", "Wait", "Finish")


def _intrinsic_literal(text: str) -> str:
    """A string literal inside an ASL intrinsic function; the characters ASL reserves there are refused."""
    if re.search(r"[\\'{}]", text):
        raise BadInput(f"{text!r} contains one of ' {{ }} \\, which ASL intrinsic functions reserve",
                       fix="use paths and names without these characters")
    return f"'{text}'"


def _command_array(argv: list[str], paths: dict[str, str]) -> str:
    """`States.Array(...)` of argv, each marker in `paths` read from its path of the state's input (the execution's
    lease holder from `$.run.holder`, a Map iteration's candidate from `$.candidate`)."""
    return "States.Array(" + ", ".join(paths[a] if a in paths else _intrinsic_literal(a) for a in argv) + ")"


def _retry_rule(retries: int, errors: list[str]) -> list[dict]:
    """A Retry rule for `errors`: `retries` attempts more with the table's backoff; none for no retries."""
    if not retries:
        return []
    return [{"ErrorEquals": errors, "IntervalSeconds": int(BACKOFF.first_s), "BackoffRate": BACKOFF.factor,
             "MaxAttempts": retries, "MaxDelaySeconds": int(BACKOFF.max_s), "JitterStrategy": "FULL"}]


def _table_retry(step: str, errors: list[str]) -> list[dict]:
    """A Retry rule for `errors` with the step's retries and the table's backoff; none for a step never retried."""
    return _retry_rule(STEPS[step].retries, errors)


def _retry(step: str, *, heartbeats: bool = True, retries: int | None = None) -> list[dict]:
    """The container never ran: retried; the step's retryable errors, or a container that stopped heartbeating: the
    table's retries (or `retries`) with its backoff; anything else is not retried (the Catch tears down)."""
    infra = {"ErrorEquals": list(ECS_INFRA_ERRORS), "IntervalSeconds": 15, "BackoffRate": 2.0, "MaxAttempts": 5,
             "MaxDelaySeconds": 300, "JitterStrategy": "FULL"}
    errors = [*retryable_error_names(), *([HEARTBEAT_TIMEOUT] if heartbeats else [])]
    return [infra, *_retry_rule(STEPS[step].retries if retries is None else retries, errors)]


def _catch(target: str, result_path: str = "$.error") -> list[dict]:
    return [{"ErrorEquals": ["States.ALL"], "ResultPath": result_path, "Next": target}]


def _fail(error: str, comment: str) -> dict:
    """A Fail state whose cause names the original error (`States.*` names cannot be re-raised)."""
    return {"Type": "Fail", "Comment": comment, "Error": error,
            "CausePath": "States.Format('{}: {}', $.error.Error, $.error.Cause)"}


class _Renderer:
    """Builds the ASL document for one release and one runner."""

    HOLDER = "\0holder"  # placeholder in argv for the execution's holder (never a real argument)
    CANDIDATE = "\0candidate"  # placeholder for a sweep's candidate, in a Map iteration
    MARKERS = {HOLDER: ("$.run.holder", "<holder>"), CANDIDATE: ("$.candidate", "<candidate>")}

    def __init__(self, config: ReleaseConfig, runner: RunnerSettings, release_id: str, config_path: str):
        self.config, self.runner, self.release_id, self.config_path = config, runner, release_id, config_path

    def ecs_task(self, step: str, argv: list[str], *, timeout_s: int, next_state: str, catch: list[dict]) -> dict:
        runner = self.runner
        override: dict[str, Any] = {"Name": runner.container_name}
        if any(a in self.MARKERS for a in argv):
            override["Command.$"] = _command_array(argv, {m: path for m, (path, _) in self.MARKERS.items()})
        else:
            override["Command"] = argv
        override["Environment"] = [
            {"Name": "SHIPLIFT_HOME", "Value": runner.state_dir},
            *([{"Name": "SHIPLIFT_LEDGER_URL", "Value": self.config.backend.ledger_url}]
              if self.config.backend.ledger_url else []),
            {"Name": "SHIPLIFT_ACTOR", "Value.$": "$.run.holder"},
            {"Name": TOKEN_ENV, "Value.$": "$$.Task.Token"},
        ]
        parameters: dict[str, Any] = {
            "Cluster": runner.cluster,
            "TaskDefinition": runner.task_definition,
            "LaunchType": runner.launch_type,
            "PropagateTags": "TASK_DEFINITION",
            "Overrides": {"ContainerOverrides": [override]},
        }
        if runner.platform_version:
            parameters["PlatformVersion"] = runner.platform_version
        if runner.subnets:
            vpc: dict[str, Any] = {"Subnets": list(runner.subnets), "AssignPublicIp": "ENABLED"
                                   if runner.assign_public_ip else "DISABLED"}
            if runner.security_groups:
                vpc["SecurityGroups"] = list(runner.security_groups)
            parameters["NetworkConfiguration"] = {"AwsvpcConfiguration": vpc}
        return {
            "Type": "Task",
            "Comment": " ".join(self.MARKERS[a][1] if a in self.MARKERS else a for a in argv),
            "Resource": ECS_RUN_TASK,
            "Parameters": parameters,
            "ResultPath": None,  # the command's reported output carries nothing the next state needs
            "TimeoutSeconds": timeout_s,
            "HeartbeatSeconds": self.heartbeat_seconds(),
            "Retry": _retry(step),
            "Catch": catch,
            "Next": next_state,
        }

    def stage_timeout(self, step: str) -> int:
        """TimeoutSeconds of a task: the step's `timeout_for` the config, plus once the time an ECS task takes to
        start."""
        return timeout_for(step, self.config) + self.runner.startup_allowance_s

    def heartbeat_seconds(self) -> int:
        """HeartbeatSeconds of a task: the first beat comes once the container has started, then one a minute; a
        container silent for longer than this is taken for dead (States.HeartbeatTimeout)."""
        return self.runner.startup_allowance_s + 3 * HEARTBEAT_EVERY_S

    def approval_wait_seconds(self) -> int:
        """TimeoutSeconds of AwaitApproval: the approval's `timeout_for` the config (`promotion.approval.timeout_s`),
        plus once the time an ECS task takes to start (the ledger's deadline counts from the request, which the task
        records once it has started, so the state times out after the deadline, never before)."""
        return timeout_for(APPROVAL.name, self.config) + self.runner.startup_allowance_s

    def approval_states(self, promote: str) -> dict[str, dict]:
        """AwaitApproval and ApprovalTimedOut. AwaitApproval's task reports only a failure: once it has recorded the
        request it exits, and the state waits on its token (`.waitForTaskToken`) for the decision `shiplift approve` or
        `shiplift reject` sends with it, both as SendTaskSuccess so the release goes on to Promote (which promotes, or
        skips with the reason); a rejection is a decision, not a failure. No HeartbeatSeconds: nothing runs to beat
        while a person reads the report (and the States Language wants HeartbeatSeconds below TimeoutSeconds).
        States.Timeout goes to ApprovalTimedOut, which records the timeout and goes on to Promote (skipped: not
        approved)."""
        rid, url = self.release_id, self.config.backend.ledger_url
        wait = self.ecs_task(APPROVAL_REQUEST.name, await_approval_command(
            rid, url, self.HOLDER, approval_token_prefix(self.config, self.runner, rid)),
            timeout_s=self.approval_wait_seconds(), next_state=promote, catch=[])
        del wait["HeartbeatSeconds"]
        wait["ResultPath"] = APPROVAL_RESULT_PATH
        wait["Retry"] = _retry(APPROVAL_REQUEST.name, heartbeats=False)
        wait["Catch"] = [{"ErrorEquals": ["States.Timeout"], "ResultPath": "$.approval_timeout",
                          "Next": APPROVAL_TIMED_OUT_STATE},
                         *_catch("TeardownAfterFailure")]
        timed_out = self.ecs_task(APPROVAL_DECISION.name, approval_timed_out_command(rid, url, self.HOLDER),
                                  timeout_s=self.stage_timeout(APPROVAL_DECISION.name), next_state=promote,
                                  catch=_catch("TeardownAfterFailure"))
        return {APPROVAL_STATE: wait, APPROVAL_TIMED_OUT_STATE: timed_out}

    def deferred_states(self, stage: str, following: str) -> dict[str, dict]:
        """A stage the table defers, as a loop around a short poll instead of one task that waits: the start task
        (named as the stage's state, with its Retry and timeout) creates the work and exits; the poll task looks once
        and publishes `{done, status, left_s}` to S3, which ReadPoll reads for the Done Choice: done goes to the
        stage's own task (Finish: `shiplift stage`, which finds the work done and records the result), else Wait
        `every_s` seconds and poll again. A failure the poll sees, and the stage's timeout passing (the poll's own
        check, from the stage's `started` record), are raised by the poll task, recorded in the ledger, and caught to
        teardown; the poll retries only a container that never ran or stopped heartbeating (it is no attempt of the
        stage: a failure it reports is the stage's)."""
        rid, url, name, every_s = self.release_id, self.config.backend.ledger_url, STATE_NAMES[stage], \
            STEPS[stage].defers.every_s
        poll, read, done, wait, finish = (name + suffix for suffix in DEFERRED_SUFFIXES)
        bucket, key = result_uri(self.config, self.runner, rid, f"{stage}-poll")
        fail = _catch("TeardownAfterFailure")
        start = self.ecs_task(stage, deferred_command("start", stage, rid, url, self.HOLDER),
                              timeout_s=self.stage_timeout(stage), next_state=poll, catch=fail)
        polled = self.ecs_task(stage, deferred_command("poll", stage, rid, url, self.HOLDER, f"s3://{bucket}/{key}"),
                               timeout_s=POLL_TASK_S + self.runner.startup_allowance_s, next_state=read, catch=fail)
        polled["Retry"] = [*_retry(stage)[:1], *_table_retry(stage, [HEARTBEAT_TIMEOUT])]
        answer = f"$.polls.{stage}.envelope"
        return {
            name: start,
            poll: polled,
            read: {"Type": "Task", "Comment": f"the poll task published its answer to s3://{bucket}/{key}",
                   "Resource": S3_GET_OBJECT, "Parameters": {"Bucket": bucket, "Key": key},
                   "ResultSelector": {"envelope.$": "States.StringToJson($.Body)"}, "ResultPath": f"$.polls.{stage}",
                   "TimeoutSeconds": READ_GATE.timeout_s, "Retry": _table_retry(READ_GATE.name, ["States.TaskFailed"]),
                   "Catch": fail, "Next": done},
            done: {"Type": "Choice", "Comment": f"{stage} in service: record it; else wait and poll again",
                   "Choices": [{"And": [{"Variable": f"{answer}.release_id", "IsPresent": True},
                                        {"Variable": f"{answer}.release_id", "StringEquals": rid},
                                        {"Variable": f"{answer}.result.done", "IsPresent": True},
                                        {"Variable": f"{answer}.result.done", "BooleanEquals": True}],
                                "Next": finish}],
                   "Default": wait},
            wait: {"Type": "Wait", "Comment": f"no worker waits: the next poll in {every_s} s", "Seconds": every_s,
                   "Next": poll},
            finish: self.ecs_task(stage, stage_command(stage, rid, url, self.HOLDER),
                                  timeout_s=self.stage_timeout(stage), next_state=following, catch=fail),
        }

    def bake_seconds(self) -> int:
        """The soak after Promote: canary and linear bake inside the promote stage, batch by batch."""
        return self.runner.post_promote_wait_s

    def render(self) -> dict:
        runner, rid, sd, url = self.runner, self.release_id, self.runner.state_dir, self.config.backend.ledger_url
        bucket, key = result_uri(self.config, runner, rid, "validate")
        approval = self.config.promotion.approval.required
        states: dict[str, dict] = {
            "Prepare": {
                "Type": "Pass",
                "Comment": "the lease holder is this execution; the execution input is not used",
                "Parameters": {"run": {
                    "holder.$": "States.Format('stepfunctions:{}', $$.Execution.Id)",
                    "release_id": rid,
                    "state_dir": sd,
                }},
                "Next": "Begin",
            },
            "Begin": self.ecs_task("begin", begin_command(self.config_path, self.HOLDER, timeouts_for(self.config),
                                                          waits_for_approval=approval),
                                   timeout_s=self.stage_timeout("begin"),
                                   next_state=STATE_NAMES[STAGES[0]], catch=_catch(BEGIN_FAILED_STATE)),
        }
        following_states = (*(STATE_NAMES[s] for s in STAGES_THROUGH_GATE[1:]), "ReadGateDecision")
        for stage, following in zip(STAGES_THROUGH_GATE, following_states, strict=True):
            if STEPS[stage].defers is not None:
                states.update(self.deferred_states(stage, following))
                continue
            publish = f"s3://{bucket}/{key}" if stage == "validate" else None
            states[STATE_NAMES[stage]] = self.ecs_task(
                stage, stage_command(stage, rid, url, self.HOLDER, publish), timeout_s=self.stage_timeout(stage),
                next_state=following, catch=_catch("TeardownAfterFailure"))
        states["ReadGateDecision"] = {
            "Type": "Task",
            "Comment": f"the validate task published its result to s3://{bucket}/{key}",
            "Resource": S3_GET_OBJECT,
            "Parameters": {"Bucket": bucket, "Key": key},
            "ResultSelector": {"envelope.$": "States.StringToJson($.Body)"},
            "ResultPath": "$.gate",
            "TimeoutSeconds": READ_GATE.timeout_s,
            "Retry": _table_retry(READ_GATE.name, ["States.TaskFailed"]),
            "Catch": _catch("TeardownAfterFailure"),
            "Next": "GateDecision",
        }
        decision, envelope_release = "$.gate.envelope.result.decision", "$.gate.envelope.release_id"
        asks = approval and self.config.validation.inconclusive.choice == "ask"
        states["GateDecision"] = {
            "Type": "Choice",
            "Comment": "promote only on decision == pass" + (
                ", or an inconclusive gate the release asks a person to decide (validation.inconclusive.choice ask)"
                if asks else "") + "; fail or inconclusive skip promote and tear down",
            "Choices": [
                {"Variable": envelope_release, "IsPresent": False, "Next": "GateResultInvalid"},
                {"Variable": decision, "IsPresent": False, "Next": "GateResultInvalid"},
                {"Not": {"Variable": envelope_release, "StringEquals": rid}, "Next": "GateResultInvalid"},
                *([asked_rule(decision)] if asks else []),
                {"Variable": decision, "StringEquals": "pass", "Next": APPROVAL_STATE
                 if approval else STATE_NAMES["promote"]},
            ],
            "Default": STATE_NAMES["teardown_candidate"],
        }
        states["GateResultInvalid"] = {
            "Type": "Pass",
            "Result": {"Error": "Shiplift.GateResultInvalid",
                       "Cause": f"s3://{bucket}/{key} is not the validate result of release {rid}"},
            "ResultPath": "$.error",
            "Next": "TeardownAfterFailure",
        }
        if approval:
            states.update(self.approval_states(STATE_NAMES["promote"]))
        bake = self.bake_seconds()
        after_promote = "Bake" if bake else STATE_NAMES["teardown_candidate"]
        if STEPS["promote"].defers is not None:  # the table's: a loop around a short poll while production updates
            states.update(self.deferred_states("promote", after_promote))
        else:
            states[STATE_NAMES["promote"]] = self.ecs_task(
                "promote", stage_command("promote", rid, url, self.HOLDER), timeout_s=self.stage_timeout("promote"),
                next_state=after_promote, catch=_catch("TeardownAfterFailure"))
        if bake:
            states["Bake"] = {
                "Type": "Wait",
                "Comment": f"{self.config.rollout.strategy} bake before the release is declared done (the lease is "
                           "still held)",
                "Seconds": bake,
                "Next": STATE_NAMES["teardown_candidate"],
            }
        states[STATE_NAMES["teardown_candidate"]] = self.ecs_task(
            "teardown_candidate", stage_command("teardown_candidate", rid, url, self.HOLDER),
            timeout_s=self.stage_timeout("teardown_candidate"),
            next_state="EndSucceeded", catch=_catch("EndFailed"))
        states["EndSucceeded"] = self.ecs_task(
            "end", end_command(rid, url, self.HOLDER, failed=False), timeout_s=self.stage_timeout("end"),
            next_state="Released", catch=_catch(END_NOT_RECORDED_STATE))
        states["Released"] = {"Type": "Succeed"}
        states["TeardownAfterFailure"] = self.ecs_task(
            "teardown_candidate", stage_command("teardown_candidate", rid, url, self.HOLDER),
            timeout_s=self.stage_timeout("teardown_candidate"),
            next_state="EndFailed", catch=_catch("EndFailed", "$.teardown_error"))
        states["EndFailed"] = self.ecs_task(
            "end", end_command(rid, url, self.HOLDER, failed=True), timeout_s=self.stage_timeout("end"),
            next_state=FAILED_STATE, catch=_catch(FAILED_STATE, "$.end_error"))
        states[FAILED_STATE] = _fail("Shiplift.ReleaseFailed", "the candidate was torn down and the failure recorded")
        states[BEGIN_FAILED_STATE] = _fail("Shiplift.BeginFailed", "nothing of this run exists: no lease, no candidate")
        states[END_NOT_RECORDED_STATE] = _fail(
            "Shiplift.EndNotRecorded",
            "stages finished but the final status was not recorded; the lease expires on its own")
        return {
            "Comment": f"shiplift release {rid} of {self.config.name}: {' -> '.join(STAGES)} "
                       f"(runner ECS {runner.launch_type}, image {runner.pipeline_image})",
            "StartAt": "Prepare",
            "States": states,
        }


def asked_rule(decision: str) -> dict:
    """The Choice rule that sends an inconclusive gate to AwaitApproval when validate asked a person to decide it
    (`ValidateResult.inconclusive.outcome == "asked"`, `tasks.pipeline.approval.awaits_person`); IsPresent first, as
    a comparison of a field a result lacks fails the execution (States.Runtime)."""
    outcome = decision.rsplit(".", 1)[0] + ".inconclusive.outcome"
    return {"And": [{"Variable": decision, "StringEquals": "inconclusive"}, {"Variable": outcome, "IsPresent": True},
                    {"Variable": outcome, "StringEquals": "asked"}], "Next": APPROVAL_STATE}


def check_image_path(config_path: str, example: str) -> None:
    """BadInput unless `config_path` is a relative .yaml path (inside the pipeline image, from the repository root)."""
    if config_path.startswith("/") or ".." in config_path.split("/") or not config_path.endswith((".yaml", ".yml")):
        raise BadInput(f"config_path {config_path!r} must be a relative .yaml path inside the pipeline image",
                       fix=f"pass the path relative to the repository root, e.g. {example}")


def require_shared_ledger(config: ReleaseConfig) -> None:
    """ConfigError unless the config's ledger is one every task reaches (Step Functions tasks share nothing else)."""
    if not config.backend.ledger_url:
        raise ConfigError("Step Functions tasks share nothing but the ledger, and this config keeps it in a SQLite "
                          "file under each task's own state dir",
                          fix="set backend.ledger_url to a PostgreSQL URL every task reaches")


def render_state_machine(config: ReleaseConfig, *, release_id: str | None = None, runner: RunnerSettings,
                         config_path: str) -> dict:
    """The release's stage graph as ASL (a dict): Tasks running `shiplift stage`, gate Choice, bake Wait, Retry/Catch,
    and AwaitApproval between the gate and Promote when the config requires an approval.

    `config_path` is the release config inside the pipeline image, relative to its working
    directory (the repository root), e.g. `configs/releases/qwen35-4b-semif.yaml`.
    """
    check_image_path(config_path, "configs/releases/NAME.yaml")
    require_shared_ledger(config)
    expected = release_id_for(config)
    if release_id is not None and release_id != expected:
        raise Conflict(
            f"release id {release_id!r} is not the release the tasks will open ({expected!r})",
            fix="omit release_id, or render from the config that release was created from",
        )
    state_machine_name(config)
    check_timeouts(config)
    return _Renderer(config, runner, expected, config_path).render()
