"""What each of the state machine's Task states runs and where its results go: the state machine's name, the argv of
every step, the places a stage publishes its result and AwaitApproval keeps its token, and the publish itself."""

from __future__ import annotations

import re

from shiplift.tasks.config import ReleaseConfig
from shiplift.tasks.errors import BadInput, ConfigError
from shiplift.tasks.hashing import canonical_json
from shiplift.tasks.ledger.events import STAGES
from shiplift.tasks.orchestrators.step_functions_runner import RunnerSettings
from shiplift.tasks.orchestrators.task_token import CLIENT_TIMEOUTS

MAX_STATE_MACHINE_NAME = 80


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


def begin_command(config_path: str, holder: str, allowed_timeouts: dict[str, int], *,
                  waits_for_approval: bool = False) -> list[str]:
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


def stage_command(stage: str, release_id: str, ledger_url: str, holder: str,
                  publish_uri: str | None = None) -> list[str]:
    """argv of one stage task (release.run_orchestrated_stage, renewing `holder`'s lease), optionally publishing its
    result."""
    argv = ["shiplift", "stage", stage, "--release", release_id, "--ledger-url", ledger_url, "--holder", holder]
    return argv + ["--result-uri", publish_uri] if publish_uri else argv


def end_command(release_id: str, ledger_url: str, holder: str, *, failed: bool) -> list[str]:
    """argv of the last step: record the final status and give the lease back (release.end_orchestrated)."""
    argv = ["shiplift", "orchestrate", "end", "--release", release_id, "--ledger-url", ledger_url, "--holder", holder]
    return argv + ["--failed"] if failed else argv


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
    client.put_object(Bucket=match[1], Key=match[2], Body=body, ContentType="application/json",
                      ChecksumAlgorithm="SHA256")
    return {"uri": uri, "bytes": len(body)}
