"""`shiplift iam`: every request a release sends is allowed by the generated pipeline policy, and nothing
that can be scoped is granted on `*`."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest

from tasks.aws.dryrun import plan_release
from tasks.aws.iam import OPERATIONS, UNSCOPABLE, Scope, execution_role_policy, iam_request, pipeline_policy
from tasks.cli import main
from tasks.config import load_release_config
from tasks.release import run_release

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("qwen35-4b-semif.yaml", "mdeberta-nli.yaml")


def allowed(policy: dict, action: str, resource: str) -> bool:
    """A simplified IAM evaluation: an Allow statement whose action and resource patterns match (no Deny is generated)."""
    for statement in policy["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        if any(fnmatch.fnmatchcase(action, a) for a in actions) and any(fnmatch.fnmatchcase(resource, r) for r in resources):
            return True
    return False


def denied_requests(config, requests) -> list[str]:
    scope, policy = Scope(config), pipeline_policy(config)
    problems = []
    for service, operation, params in requests:
        needed = iam_request(scope, service, operation, params)
        if needed and not allowed(policy, *needed):
            problems.append(f"{service} {operation}: {needed}")
    return problems


CANARY = ("rollout.strategy=canary", "rollout.copies=2", "rollout.online_gate.split=test",
          "rollout.alarms.max_latency_p99_ms=2000")


@pytest.mark.parametrize("name, overrides", [*((name, ()) for name in PRODUCTION), ("qwen35-4b-semif.yaml", CANARY)])
def test_every_dry_run_request_is_allowed_and_star_only_holds_unscopable_actions(name, overrides):
    config = load_release_config(ROOT / "configs" / "releases" / name, overrides=overrides, environ={})
    planned = plan_release(config, config_dir=ROOT / "configs" / "releases")
    assert {(r.service, r.operation) for r in planned} <= set(OPERATIONS), "the policy table knows every operation"
    assert denied_requests(config, [(r.service, r.operation, r.params) for r in planned]) == []
    for statement in pipeline_policy(config)["Statement"]:
        if "*" in statement["Resource"]:
            assert set(statement["Action"]) <= UNSCOPABLE, statement
            if "cloudwatch:PutMetricData" in statement["Action"]:
                assert statement["Condition"] == {"StringEquals": {"cloudwatch:namespace": "shiplift/Rollout"}}
    for statement in execution_role_policy(config)["Statement"]:
        if "*" in statement["Resource"]:
            assert set(statement["Action"]) <= UNSCOPABLE | {"cloudwatch:PutMetricData"}, statement
            if statement["Action"] == ["cloudwatch:PutMetricData"]:
                assert statement["Condition"]["StringEquals"]["cloudwatch:namespace"], "metrics only to SageMaker's namespaces"


def test_requests_outside_the_prefix_bucket_or_repository_are_not_allowed():
    config = load_release_config(ROOT / "configs/releases/qwen35-4b-semif.yaml", environ={})
    outside = [
        ("sagemaker", "DeleteEndpoint", {"EndpointName": "payments-fraud-prod"}),
        ("sagemaker", "CreateModel", {"ModelName": "other-team-model"}),
        ("s3", "PutObject", {"Bucket": config.backend.bucket, "Key": "other-prefix/x"}),
        ("s3", "GetObject", {"Bucket": "someone-elses-bucket", "Key": "shiplift/x"}),
        ("ecr", "DescribeImages", {"repositoryName": "other/repo"}),
        ("codebuild", "StartBuild", {"projectName": "other-project"}),
    ]
    assert len(denied_requests(config, outside)) == len(outside)
    assert not denied_requests(config, [("sagemaker", "DeleteEndpoint", {"EndpointName": "shiplift-qwen35-4b-semif-prod"})])


def test_every_call_of_a_real_release_is_in_the_table_and_allowed(aws, aws_calls, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    path = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    assert run_release(path, progress=lambda message: None)["status"] == "promoted"
    config = load_release_config(path)
    assert {(service, operation) for service, operation, _ in aws_calls} <= set(OPERATIONS)
    assert denied_requests(config, aws_calls) == []


def test_iam_command_writes_the_documents(tmp_path, capsys):
    assert main(["iam", str(ROOT / "configs/releases/mdeberta-nli.yaml"), "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["codebuild-policy.json", "codebuild-trust.json", "pipeline-policy.json", "sagemaker-execution-policy.json",
                     "sagemaker-execution-trust.json"]
    trust = json.loads((tmp_path / "sagemaker-execution-trust.json").read_text())
    assert trust["Statement"][0]["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert main(["iam", str(ROOT / "configs/releases/gemma-decision.yaml")]) == 2
    assert "uses the local backend" in capsys.readouterr().err
