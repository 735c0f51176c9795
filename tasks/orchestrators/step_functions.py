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
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.config import ReleaseConfig
from tasks.errors import BadInput, ConfigError, Conflict, NotFound
from tasks.hashing import canonical_json
from tasks.orchestrators.task_token import CLIENT_TIMEOUTS, HEARTBEAT_EVERY_S, HEARTBEAT_TIMEOUT, TOKEN_ENV, retryable_error_names
from tasks.ledger.events import STAGES
from tasks.pipeline.release import release_id_for
from tasks.pipeline.table import (APPROVAL, APPROVAL_DECISION, APPROVAL_REQUEST, BACKOFF, READ_GATE, STEPS, check_timeouts,
                                  timeout_for, timeouts_for)

MAX_STATE_MACHINE_NAME = 80
MANAGED_TAGS = ("shiplift:model", "shiplift:managed")
ECS_RUN_TASK = "arn:aws:states:::ecs:runTask.waitForTaskToken"
S3_GET_OBJECT = "arn:aws:states:::aws-sdk:s3:getObject"
ROLE_ARN_PATTERN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/.+")

# Errors that mean the container never ran (no capacity, throttled or failed RunTask): always
# safe to retry. `AmazonECS.Unknown` is what RunTask raises when the response carries `Failures`
# (e.g. "Capacity is unavailable at this time"); `ECS.*` are RunTask API exceptions.
ECS_INFRA_ERRORS = ("AmazonECS.Unknown", "ECS.AmazonECSException", "ECS.ServerException", "ECS.LimitExceededException")
STATE_NAMES = {stage: "".join(part.title() for part in stage.split("_")) for stage in STAGES}
TEARDOWN_STATES = ("TeardownCandidate", "TeardownAfterFailure")
FAILED_STATE, BEGIN_FAILED_STATE, END_NOT_RECORDED_STATE = "ReleaseFailed", "BeginFailed", "EndNotRecorded"
APPROVAL_STATE, APPROVAL_TIMED_OUT_STATE = "AwaitApproval", "ApprovalTimedOut"
APPROVAL_RESULT_PATH = "$.approval"  # what `shiplift approve` / `reject` sends with the token: decision, by, seq


class RunnerSettings(BaseModel):
    """Where and how the Task states run the pipeline image (ECS RunTask `.sync`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    cluster: str = Field(min_length=1, description="ECS cluster name or ARN")
    task_definition: str = Field(
        pattern=r"^(arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task-definition/)?[A-Za-z0-9_-]{1,255}:\d+$",
        description="family:revision (a revision is immutable, so it pins the image)",
    )
    container_name: str = Field("pipeline", min_length=1, description="the container in the task definition that runs shiplift")
    pipeline_image: str = Field(pattern=r"^[^@\s]+@sha256:[0-9a-f]{64}$", description="the pipeline image, pinned by digest")
    launch_type: Literal["FARGATE", "EC2"] = "FARGATE"
    platform_version: str | None = Field(None, description="Fargate platform version; None = AWS's LATEST")
    subnets: list[str] = Field(default_factory=list, max_length=16)
    security_groups: list[str] = Field(default_factory=list, max_length=5)
    assign_public_ip: bool = False
    state_dir: str = Field("/tmp/shiplift", description="each task's own scratch space and caches (nothing is shared)")
    result_bucket: str | None = Field(None, description="bucket for stage results; None = the aws backend's bucket")
    result_prefix: str = Field("shiplift/stepfunctions", pattern=r"^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*$")
    startup_allowance_s: int = Field(900, ge=0, le=3600, description="how long an ECS task may take to start (image pull); "
                                     "added once to every task's timeout from the stage table, and to its heartbeat")
    post_promote_wait_s: int = Field(60, ge=0, le=3600, description="bake after an all_at_once/blue_green promotion")

    @field_validator("subnets")
    @classmethod
    def _subnet_ids(cls, subnets: list[str]) -> list[str]:
        bad = [s for s in subnets if not re.fullmatch(r"subnet-[0-9a-f]{8,17}", s)]
        if bad:
            raise ValueError(f"not subnet ids: {bad}; write subnet-0123456789abcdef0")
        return subnets

    @field_validator("security_groups")
    @classmethod
    def _security_group_ids(cls, groups: list[str]) -> list[str]:
        bad = [g for g in groups if not re.fullmatch(r"sg-[0-9a-f]{8,17}", g)]
        if bad:
            raise ValueError(f"not security group ids: {bad}; write sg-0123456789abcdef0")
        return groups

    @field_validator("state_dir")
    @classmethod
    def _absolute_state_dir(cls, state_dir: str) -> str:
        if not state_dir.startswith("/") or ".." in state_dir.split("/"):
            raise ValueError(f"state_dir must be an absolute path without '..', got {state_dir!r}")
        return state_dir

    @model_validator(mode="after")
    def _launch_type_fits(self) -> "RunnerSettings":
        if self.launch_type == "FARGATE" and not self.subnets:
            raise ValueError("FARGATE tasks use awsvpc networking: give at least one subnet in subnets")
        if self.launch_type == "EC2" and (self.platform_version is not None or self.assign_public_ip):
            raise ValueError("platform_version and assign_public_ip apply to FARGATE only; remove them for launch_type EC2")
        return self


def load_runner_settings(path: str) -> RunnerSettings:
    """Read RunnerSettings from a YAML file; ConfigError names the file and the bad fields."""
    from pathlib import Path

    from pydantic import ValidationError

    from tasks.yamlfile import read_yaml_file

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"runner settings file {file} does not exist", fix="write one as shown in docs/step-functions.md")
    tree = read_yaml_file(file, "runner settings file")
    try:
        return RunnerSettings.model_validate(tree)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{file}: invalid runner settings\n" + "\n".join(lines), fix="correct the fields listed above") from exc


def state_machine_name(config: ReleaseConfig) -> str:
    """`<resource_prefix>-<model>-release`: one state machine per model, at most 80 characters."""
    name = f"{config.resource_prefix}-{config.name}-release"
    if len(name) > MAX_STATE_MACHINE_NAME:
        raise ConfigError(
            f"state machine name {name!r} is {len(name)} characters, Step Functions allows {MAX_STATE_MACHINE_NAME}",
            fix="shorten resource_prefix or name",
        )
    return name


def results_bucket(config: ReleaseConfig, runner: RunnerSettings) -> str:
    """The bucket stage results go to: the runner's result_bucket, else the aws backend's bucket."""
    bucket = runner.result_bucket or getattr(config.backend, "bucket", None)
    if not bucket:
        raise ConfigError(
            f"no bucket for stage results: backend.kind is {config.backend.kind!r} and runner result_bucket is unset",
            fix="set result_bucket in the runner settings",
        )
    return bucket


def result_uri(config: ReleaseConfig, runner: RunnerSettings, release_id: str, stage: str) -> tuple[str, str]:
    """(bucket, key) where a stage task publishes its result for the state machine to read."""
    return results_bucket(config, runner), f"{runner.result_prefix}/{release_id}/{stage}.json"


def begin_command(config_path: str, holder: str, allowed_timeouts: dict[str, int], *, waits_for_approval: bool = False) -> list[str]:
    """argv of the first step: check the config's deadlines against the rendered timeouts, open the release and take
    the model's lease (release.begin_orchestrated; `--waits-for-approval` when the definition has AwaitApproval, so a
    config requiring an approval is accepted)."""
    allowed = ",".join(f"{name}={seconds}" for name, seconds in allowed_timeouts.items())
    argv = ["shiplift", "orchestrate", "begin", config_path, "--holder", holder, "--allowed-timeouts", allowed]
    return argv + ["--waits-for-approval"] if waits_for_approval else argv


def approval_token_prefix(config: ReleaseConfig, runner: RunnerSettings, release_id: str) -> str:
    """s3://BUCKET/PREFIX/RELEASE_ID/approval: where the AwaitApproval task keeps its task token for the approver (the
    ledger records only the token's sha256 and this place: a token is a secret the ledger refuses)."""
    return f"s3://{results_bucket(config, runner)}/{runner.result_prefix}/{release_id}/approval"


def await_approval_command(release_id: str, ledger_url: str, holder: str, token_prefix: str) -> list[str]:
    """argv of AwaitApproval: record the request with its token's reference and exit without reporting
    (task_token.await_approval)."""
    return ["shiplift", "orchestrate", "await-approval", "--release", release_id, "--ledger-url", ledger_url,
            "--holder", holder, "--token-prefix", token_prefix]


def approval_timed_out_command(release_id: str, ledger_url: str, holder: str) -> list[str]:
    """argv of ApprovalTimedOut: record that the wait timed out (unless decided) and take the lease back for Promote
    (task_token.approval_timed_out)."""
    return ["shiplift", "orchestrate", "approval-timed-out", "--release", release_id, "--ledger-url", ledger_url,
            "--holder", holder]


def stage_command(stage: str, release_id: str, ledger_url: str, holder: str, publish_uri: str | None = None) -> list[str]:
    """argv of one stage task (release.run_orchestrated_stage, renewing `holder`'s lease), optionally publishing its
    result."""
    argv = ["shiplift", "stage", stage, "--release", release_id, "--ledger-url", ledger_url, "--holder", holder]
    return argv + ["--result-uri", publish_uri] if publish_uri else argv


def end_command(release_id: str, ledger_url: str, holder: str, *, failed: bool) -> list[str]:
    """argv of the last step: record the final status and give the lease back (release.end_orchestrated)."""
    argv = ["shiplift", "orchestrate", "end", "--release", release_id, "--ledger-url", ledger_url, "--holder", holder]
    return argv + ["--failed"] if failed else argv


def _intrinsic_literal(text: str) -> str:
    """A string literal inside an ASL intrinsic function; the characters ASL reserves there are refused."""
    if re.search(r"[\\'{}]", text):
        raise BadInput(f"{text!r} contains one of ' {{ }} \\, which ASL intrinsic functions reserve",
                       fix="use paths and names without these characters")
    return f"'{text}'"


def _command_array(argv: list[str], holder_marker: str) -> str:
    """`States.Array(...)` of argv with the execution's lease holder read from `$.run.holder`."""
    return "States.Array(" + ", ".join("$.run.holder" if a == holder_marker else _intrinsic_literal(a) for a in argv) + ")"


def _table_retry(step: str, errors: list[str]) -> list[dict]:
    """A Retry rule for `errors` with the step's retries and the table's backoff; none for a step never retried."""
    if not STEPS[step].retries:
        return []
    return [{"ErrorEquals": errors, "IntervalSeconds": int(BACKOFF.first_s), "BackoffRate": BACKOFF.factor,
             "MaxAttempts": STEPS[step].retries, "MaxDelaySeconds": int(BACKOFF.max_s), "JitterStrategy": "FULL"}]


def _retry(step: str, *, heartbeats: bool = True) -> list[dict]:
    """The container never ran: retried; the step's retryable errors, or a container that stopped heartbeating: the
    table's retries with its backoff; anything else is not retried (the Catch tears down)."""
    infra = {"ErrorEquals": list(ECS_INFRA_ERRORS), "IntervalSeconds": 15, "BackoffRate": 2.0, "MaxAttempts": 5,
             "MaxDelaySeconds": 300, "JitterStrategy": "FULL"}
    return [infra, *_table_retry(step, [*retryable_error_names(), *([HEARTBEAT_TIMEOUT] if heartbeats else [])])]


def _catch(target: str, result_path: str = "$.error") -> list[dict]:
    return [{"ErrorEquals": ["States.ALL"], "ResultPath": result_path, "Next": target}]


def _fail(error: str, comment: str) -> dict:
    """A Fail state whose cause names the original error (`States.*` names cannot be re-raised)."""
    return {"Type": "Fail", "Comment": comment, "Error": error,
            "CausePath": "States.Format('{}: {}', $.error.Error, $.error.Cause)"}


class _Renderer:
    """Builds the ASL document for one release and one runner."""

    HOLDER = "\0holder"  # placeholder in argv for the execution's holder (never a real argument)

    def __init__(self, config: ReleaseConfig, runner: RunnerSettings, release_id: str, config_path: str):
        self.config, self.runner, self.release_id, self.config_path = config, runner, release_id, config_path

    def ecs_task(self, step: str, argv: list[str], *, timeout_s: int, next_state: str, catch: list[dict]) -> dict:
        runner = self.runner
        override: dict[str, Any] = {"Name": runner.container_name}
        if self.HOLDER in argv:
            override["Command.$"] = _command_array(argv, self.HOLDER)
        else:
            override["Command"] = argv
        override["Environment"] = [
            {"Name": "SHIPLIFT_HOME", "Value": runner.state_dir},
            *([{"Name": "SHIPLIFT_LEDGER_URL", "Value": self.config.backend.ledger_url}] if self.config.backend.ledger_url else []),
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
            vpc: dict[str, Any] = {"Subnets": list(runner.subnets), "AssignPublicIp": "ENABLED" if runner.assign_public_ip else "DISABLED"}
            if runner.security_groups:
                vpc["SecurityGroups"] = list(runner.security_groups)
            parameters["NetworkConfiguration"] = {"AwsvpcConfiguration": vpc}
        return {
            "Type": "Task",
            "Comment": " ".join(a if a != self.HOLDER else "<holder>" for a in argv),
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
        """TimeoutSeconds of a task: the step's `timeout_for` the config, plus once the time an ECS task takes to start."""
        return timeout_for(step, self.config) + self.runner.startup_allowance_s

    def heartbeat_seconds(self) -> int:
        """HeartbeatSeconds of a task: the first beat comes once the container has started, then one a minute; a
        container silent for longer than this is taken for dead (States.HeartbeatTimeout)."""
        return self.runner.startup_allowance_s + 3 * HEARTBEAT_EVERY_S

    def approval_wait_seconds(self) -> int:
        """TimeoutSeconds of AwaitApproval: the approval's `timeout_for` the config (`promotion.approval.timeout_s`), plus
        once the time an ECS task takes to start (the ledger's deadline counts from the request, which the task records
        once it has started, so the state times out after the deadline, never before)."""
        return timeout_for(APPROVAL.name, self.config) + self.runner.startup_allowance_s

    def approval_states(self, promote: str) -> dict[str, dict]:
        """AwaitApproval and ApprovalTimedOut. AwaitApproval's task reports only a failure: once it has recorded the
        request it exits, and the state waits on its token (`.waitForTaskToken`) for the decision `shiplift approve` or
        `shiplift reject` sends with it, both as SendTaskSuccess so the release goes on to Promote (which promotes, or
        skips with the reason); a rejection is a decision, not a failure. No HeartbeatSeconds: nothing runs to beat while
        a person reads the report (and the States Language wants HeartbeatSeconds below TimeoutSeconds). States.Timeout
        goes to ApprovalTimedOut, which records the timeout and goes on to Promote (skipped: not approved)."""
        rid, url = self.release_id, self.config.backend.ledger_url
        wait = self.ecs_task(APPROVAL_REQUEST.name, await_approval_command(
            rid, url, self.HOLDER, approval_token_prefix(self.config, self.runner, rid)),
            timeout_s=self.approval_wait_seconds(), next_state=promote, catch=[])
        del wait["HeartbeatSeconds"]
        wait["ResultPath"] = APPROVAL_RESULT_PATH
        wait["Retry"] = _retry(APPROVAL_REQUEST.name, heartbeats=False)
        wait["Catch"] = [{"ErrorEquals": ["States.Timeout"], "ResultPath": "$.approval_timeout", "Next": APPROVAL_TIMED_OUT_STATE},
                         *_catch("TeardownAfterFailure")]
        timed_out = self.ecs_task(APPROVAL_DECISION.name, approval_timed_out_command(rid, url, self.HOLDER),
                                  timeout_s=self.stage_timeout(APPROVAL_DECISION.name), next_state=promote,
                                  catch=_catch("TeardownAfterFailure"))
        return {APPROVAL_STATE: wait, APPROVAL_TIMED_OUT_STATE: timed_out}

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
        for stage, following in zip(STAGES[:6], (*(STATE_NAMES[s] for s in STAGES[1:6]), "ReadGateDecision")):
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
                {"Variable": decision, "StringEquals": "pass", "Next": APPROVAL_STATE if approval else STATE_NAMES["promote"]},
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
        states[STATE_NAMES["promote"]] = self.ecs_task(
            "promote", stage_command("promote", rid, url, self.HOLDER), timeout_s=self.stage_timeout("promote"),
            next_state=after_promote, catch=_catch("TeardownAfterFailure"))
        if bake:
            states["Bake"] = {
                "Type": "Wait",
                "Comment": f"{self.config.rollout.strategy} bake before the release is declared done (the lease is still held)",
                "Seconds": bake,
                "Next": STATE_NAMES["teardown_candidate"],
            }
        states[STATE_NAMES["teardown_candidate"]] = self.ecs_task(
            "teardown_candidate", stage_command("teardown_candidate", rid, url, self.HOLDER), timeout_s=self.stage_timeout("teardown_candidate"),
            next_state="EndSucceeded", catch=_catch("EndFailed"))
        states["EndSucceeded"] = self.ecs_task(
            "end", end_command(rid, url, self.HOLDER, failed=False), timeout_s=self.stage_timeout("end"),
            next_state="Released", catch=_catch(END_NOT_RECORDED_STATE))
        states["Released"] = {"Type": "Succeed"}
        states["TeardownAfterFailure"] = self.ecs_task(
            "teardown_candidate", stage_command("teardown_candidate", rid, url, self.HOLDER), timeout_s=self.stage_timeout("teardown_candidate"),
            next_state="EndFailed", catch=_catch("EndFailed", "$.teardown_error"))
        states["EndFailed"] = self.ecs_task(
            "end", end_command(rid, url, self.HOLDER, failed=True), timeout_s=self.stage_timeout("end"),
            next_state=FAILED_STATE, catch=_catch(FAILED_STATE, "$.end_error"))
        states[FAILED_STATE] = _fail("Shiplift.ReleaseFailed", "the candidate was torn down and the failure recorded")
        states[BEGIN_FAILED_STATE] = _fail("Shiplift.BeginFailed", "nothing of this run exists: no lease, no candidate")
        states[END_NOT_RECORDED_STATE] = _fail(
            "Shiplift.EndNotRecorded", "stages finished but the final status was not recorded; the lease expires on its own")
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


def render_state_machine(config: ReleaseConfig, *, release_id: str | None = None, runner: RunnerSettings,
                         config_path: str) -> dict:
    """The release's stage graph as ASL (a dict): Tasks running `shiplift stage`, gate Choice, bake Wait, Retry/Catch,
    and AwaitApproval between the gate and Promote when the config requires an approval.

    `config_path` is the release config inside the pipeline image, relative to its working
    directory (the repository root), e.g. `configs/releases/qwen35-4b-semif.yaml`.
    """
    if config_path.startswith("/") or ".." in config_path.split("/") or not config_path.endswith((".yaml", ".yml")):
        raise BadInput(
            f"config_path {config_path!r} must be a relative .yaml path inside the pipeline image",
            fix="pass the path relative to the repository root, e.g. configs/releases/NAME.yaml",
        )
    if not config.backend.ledger_url:
        raise ConfigError("Step Functions tasks share nothing but the ledger, and this config keeps it in a SQLite file "
                          "under each task's own state dir", fix="set backend.ledger_url to a PostgreSQL URL every task reaches")
    expected = release_id_for(config)
    if release_id is not None and release_id != expected:
        raise Conflict(
            f"release id {release_id!r} is not the release the tasks will open ({expected!r})",
            fix="omit release_id, or render from the config that release was created from",
        )
    state_machine_name(config)
    check_timeouts(config)
    return _Renderer(config, runner, expected, config_path).render()


def definition_json(definition: dict) -> str:
    """The definition as the JSON text sent to Step Functions (stable key order, indented)."""
    return json.dumps(definition, indent=2, ensure_ascii=False)


def _stepfunctions_client(config: ReleaseConfig):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import NoRegionError

    region = getattr(config.backend, "region", None)
    try:
        return boto3.client("stepfunctions", region_name=region, config=Config(**CLIENT_TIMEOUTS))
    except NoRegionError as exc:
        raise ConfigError("no AWS region for Step Functions", fix="use an aws backend config or set AWS_DEFAULT_REGION") from exc


def _find_state_machine(client, name: str) -> str | None:
    for page in client.get_paginator("list_state_machines").paginate():
        for machine in page["stateMachines"]:
            if machine["name"] == name:
                return machine["stateMachineArn"]
    return None


def _partition(region: str) -> str:
    return "aws-cn" if region.startswith("cn-") else "aws-us-gov" if region.startswith("us-gov-") else "aws"


def state_machine_role_policy(config: ReleaseConfig, runner: RunnerSettings, *, account_id: str, region: str) -> dict:
    """Least-privilege IAM policy for the state machine's role: run and track the pipeline tasks,
    the `.sync` EventBridge rule, pass only prefix-named task roles, read the stage results."""
    if not re.fullmatch(r"\d{12}", account_id):
        raise BadInput(f"account_id {account_id!r} is not a 12-digit AWS account id", fix="pass the account that runs the state machine")
    if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", region):
        raise BadInput(f"region {region!r} is not an AWS region name", fix="pass e.g. us-east-1")
    arn = f"arn:{_partition(region)}"
    cluster_name = runner.cluster.rsplit("/", 1)[-1]
    cluster_arn = runner.cluster if runner.cluster.startswith("arn:") else f"{arn}:ecs:{region}:{account_id}:cluster/{cluster_name}"
    task_definition_arn = (runner.task_definition if runner.task_definition.startswith("arn:")
                           else f"{arn}:ecs:{region}:{account_id}:task-definition/{runner.task_definition}")
    bucket = results_bucket(config, runner)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "RunPipelineTasks", "Effect": "Allow", "Action": "ecs:RunTask", "Resource": task_definition_arn,
             "Condition": {"ArnEquals": {"ecs:cluster": cluster_arn}}},
            {"Sid": "TrackPipelineTasks", "Effect": "Allow", "Action": ["ecs:DescribeTasks", "ecs:StopTask"],
             "Resource": f"{arn}:ecs:{region}:{account_id}:task/{cluster_name}/*"},
            {"Sid": "EcsSyncRule", "Effect": "Allow", "Action": ["events:PutTargets", "events:PutRule", "events:DescribeRule"],
             "Resource": f"{arn}:events:{region}:{account_id}:rule/StepFunctionsGetEventsForECSTaskRule"},
            {"Sid": "PassPipelineRoles", "Effect": "Allow", "Action": "iam:PassRole",
             "Resource": f"{arn}:iam::{account_id}:role/{config.resource_prefix}-*",
             "Condition": {"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}}},
            {"Sid": "ReadStageResults", "Effect": "Allow", "Action": "s3:GetObject",
             "Resource": f"{arn}:s3:::{bucket}/{runner.result_prefix}/{config.name}-*/*"},
        ],
    }


def approver_policy(config: ReleaseConfig, runner: RunnerSettings, *, account_id: str, region: str) -> dict:
    """Least-privilege IAM policy for whoever runs `shiplift approve` / `reject` on a release waiting in AwaitApproval:
    read the task token its task kept under the result prefix (this model's releases only) and send the decision with
    it (SendTaskSuccess, for both decisions). SendTaskSuccess has no resource type in the Service Authorization
    Reference, so it is granted on `*`: the token names the execution, and only the token the release's own ledger
    record names is sent.
    (A bucket whose default encryption is SSE-KMS also needs kms:Decrypt on its key.)"""
    if not re.fullmatch(r"\d{12}", account_id):
        raise BadInput(f"account_id {account_id!r} is not a 12-digit AWS account id", fix="pass the account that runs the state machine")
    if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", region):
        raise BadInput(f"region {region!r} is not an AWS region name", fix="pass e.g. us-east-1")
    bucket = results_bucket(config, runner)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ReadApprovalTaskTokens", "Effect": "Allow", "Action": "s3:GetObject",
             "Resource": f"arn:{_partition(region)}:s3:::{bucket}/{runner.result_prefix}/{config.name}-*/approval/*"},
            {"Sid": "SendTheDecision", "Effect": "Allow", "Action": "states:SendTaskSuccess", "Resource": "*"},
        ],
    }


def deploy_state_machine(config: ReleaseConfig, definition: dict, *, role_arn: str, client=None) -> dict:
    """Create the model's state machine, or update it in place when its definition or role differ.

    Idempotent: when definition, role and tags already match, no call that changes anything is
    made. A same-named state machine that shiplift does not manage is never touched.
    """
    from botocore.exceptions import ClientError

    if not ROLE_ARN_PATTERN.match(role_arn):
        raise BadInput(f"role_arn {role_arn!r} is not an IAM role ARN", fix="pass arn:aws:iam::ACCOUNT:role/NAME")
    name = state_machine_name(config)
    tags = {MANAGED_TAGS[0]: config.name, MANAGED_TAGS[1]: "true"}
    client = client or _stepfunctions_client(config)
    text = definition_json(definition)
    try:
        arn = _find_state_machine(client, name)
        if arn is None:
            created = client.create_state_machine(
                name=name, definition=text, roleArn=role_arn, type="STANDARD",
                tags=[{"key": k, "value": v} for k, v in tags.items()],
            )
            return {"arn": created["stateMachineArn"], "name": name, "status": "created"}
        live_tags = {t["key"]: t["value"] for t in client.list_tags_for_resource(resourceArn=arn)["tags"]}
        if live_tags.get(MANAGED_TAGS[1]) != "true" or live_tags.get(MANAGED_TAGS[0]) not in (None, config.name):
            raise Conflict(
                f"state machine {name} exists but is not managed by shiplift for {config.name} (tags {live_tags})",
                fix="delete or rename it, or change resource_prefix",
            )
        described = client.describe_state_machine(stateMachineArn=arn)
        if described.get("type", "STANDARD") != "STANDARD":
            raise Conflict(f"state machine {name} is {described['type']}; .sync tasks need STANDARD", fix="delete it and deploy again")
        status = "unchanged"
        if canonical_json(json.loads(described["definition"])) != canonical_json(definition) or described["roleArn"] != role_arn:
            client.update_state_machine(stateMachineArn=arn, definition=text, roleArn=role_arn)
            status = "updated"
        if any(live_tags.get(k) != v for k, v in tags.items()):
            client.tag_resource(resourceArn=arn, tags=[{"key": k, "value": v} for k, v in tags.items()])
            status = "updated"
        return {"arn": arn, "name": name, "status": status}
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        message = exc.response.get("Error", {}).get("Message", str(exc))
        if code in ("InvalidDefinition", "InvalidArn", "InvalidName", "ValidationException"):
            raise BadInput(f"Step Functions refused state machine {name}: {code}: {message}", fix="fix the definition or arguments") from exc
        raise


def publish_stage_result(uri: str, *, release_id: str, stage: str, result: dict, client=None) -> dict:
    """Write a stage's result to S3 as `{release_id, stage, result}` so the state machine can read it.

    What `shiplift stage NAME --result-uri s3://…` calls after the stage succeeds: an ECS task
    has no output of its own, and the Choice on the gate decision needs the validate result.
    """
    match = re.fullmatch(r"s3://([^/]+)/(.+)", uri)
    if not match:
        raise BadInput(f"result uri {uri!r} is not s3://BUCKET/KEY", fix="pass --result-uri s3://BUCKET/KEY")
    if stage not in STAGES:
        raise BadInput(f"unknown stage {stage!r}", fix=f"use one of {', '.join(STAGES)}")
    body = canonical_json({"release_id": release_id, "stage": stage, "result": result})
    if client is None:
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", config=Config(**CLIENT_TIMEOUTS))
    client.put_object(Bucket=match[1], Key=match[2], Body=body, ContentType="application/json", ChecksumAlgorithm="SHA256")
    return {"uri": uri, "bytes": len(body)}


def verify_task_definition(runner: RunnerSettings, *, client=None, region: str | None = None) -> dict:
    """Check that the runner's task definition runs the pinned pipeline image in the named container."""
    if client is None:
        import boto3
        from botocore.config import Config

        client = boto3.client("ecs", region_name=region, config=Config(**CLIENT_TIMEOUTS))
    task = client.describe_task_definition(taskDefinition=runner.task_definition)["taskDefinition"]
    containers = {c["name"]: c for c in task.get("containerDefinitions", [])}
    if runner.container_name not in containers:
        raise NotFound(
            f"task definition {runner.task_definition} has no container {runner.container_name!r} (has {sorted(containers)})",
            fix="set container_name in the runner settings",
        )
    image = containers[runner.container_name]["image"]
    if image != runner.pipeline_image:
        raise Conflict(
            f"task definition {runner.task_definition} runs {image}, not the pinned pipeline image {runner.pipeline_image}",
            fix="register a revision with the pinned image and point task_definition at it",
        )
    if runner.launch_type not in task.get("requiresCompatibilities", [runner.launch_type]):
        raise Conflict(f"task definition {runner.task_definition} is not compatible with {runner.launch_type}",
                       fix="register it with requiresCompatibilities including the launch type")
    return {"task_definition": task.get("taskDefinitionArn", runner.task_definition), "image": image}
