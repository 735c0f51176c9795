"""Least-privilege IAM policies for the Step Functions release: the state machine's role, and whoever sends an
approval's decision with its task token."""

from __future__ import annotations

import re

from shiplift.tasks.config import ReleaseConfig
from shiplift.tasks.errors import BadInput
from shiplift.tasks.orchestrators.step_functions_runner import RunnerSettings
from shiplift.tasks.orchestrators.step_functions_tasks import results_bucket


def _partition(region: str) -> str:
    return "aws-cn" if region.startswith("cn-") else "aws-us-gov" if region.startswith("us-gov-") else "aws"


def state_machine_role_policy(config: ReleaseConfig, runner: RunnerSettings, *, account_id: str, region: str) -> dict:
    """Least-privilege IAM policy for the state machine's role: run and track the pipeline tasks,
    the `.sync` EventBridge rule, pass only prefix-named task roles, read the stage results."""
    if not re.fullmatch(r"\d{12}", account_id):
        raise BadInput(f"account_id {account_id!r} is not a 12-digit AWS account id",
                       fix="pass the account that runs the state machine")
    if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", region):
        raise BadInput(f"region {region!r} is not an AWS region name", fix="pass e.g. us-east-1")
    arn = f"arn:{_partition(region)}"
    cluster_name = runner.cluster.rsplit("/", 1)[-1]
    cluster_arn = (runner.cluster if runner.cluster.startswith("arn:")
                   else f"{arn}:ecs:{region}:{account_id}:cluster/{cluster_name}")
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
            {"Sid": "EcsSyncRule", "Effect": "Allow",
             "Action": ["events:PutTargets", "events:PutRule", "events:DescribeRule"],
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
        raise BadInput(f"account_id {account_id!r} is not a 12-digit AWS account id",
                       fix="pass the account that runs the state machine")
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
