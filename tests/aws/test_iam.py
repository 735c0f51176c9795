"""`shiplift iam`: every request a release sends is allowed by the generated pipeline policy, and nothing
that can be scoped is granted on `*`; with ledger checkpoints, exactly what signing and verifying send is added."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest

from tasks.backends.aws.dryrun import plan_release
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tasks.backends.aws.iam import (CHECKPOINT_OPERATIONS, OPERATIONS, UNSCOPABLE, Scope, execution_role_policy, iam_request,
                           pipeline_policy)
from tasks.cli.main import main
from tasks.config import load_release_config
from tasks.pipeline.release import run_release
from tests.aws.test_checkpoints_aws import BUCKET as CHECKPOINT_BUCKET, SECRET, _pem, _prepare

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
        for needed in iam_request(scope, service, operation, params):
            if not allowed(policy, *needed):
                problems.append(f"{service} {operation}: {needed}")
    return problems


def checkpoints(key_ref: str = SECRET, **more) -> str:
    """A `--set` that turns on ledger checkpoints (the moto tests' bucket and secret)."""
    return "backend.checkpoints=" + json.dumps({"key_ref": key_ref, "bucket": CHECKPOINT_BUCKET, **more})


CANARY = ("rollout.strategy=canary", "rollout.copies=2", "rollout.online_gate.split=test",
          "rollout.alarms.max_latency_p99_ms=2000")


@pytest.mark.parametrize("name, overrides", [*((name, ()) for name in PRODUCTION), ("qwen35-4b-semif.yaml", CANARY),
                                             ("mdeberta-nli.yaml", (checkpoints(), "backend.kms_key_id=alias/shiplift"))])
def test_every_dry_run_request_is_allowed_and_star_only_holds_unscopable_actions(name, overrides):
    config = load_release_config(ROOT / "configs" / "releases" / name, overrides=overrides, environ={})
    planned = plan_release(config, config_dir=ROOT / "configs" / "releases")
    known = set(OPERATIONS) | set(CHECKPOINT_OPERATIONS)
    assert {(r.service, r.operation) for r in planned} <= known, "the policy tables know every operation"
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
    config = load_release_config(ROOT / "configs/releases/qwen35-4b-semif.yaml", overrides=(checkpoints(),), environ={})
    outside = [
        ("sagemaker", "DeleteEndpoint", {"EndpointName": "payments-fraud-prod"}),
        ("sagemaker", "CreateModel", {"ModelName": "other-team-model"}),
        ("s3", "PutObject", {"Bucket": config.backend.bucket, "Key": "other-prefix/x"}),
        ("s3", "GetObject", {"Bucket": "someone-elses-bucket", "Key": "shiplift/x"}),
        ("ecr", "DescribeImages", {"repositoryName": "other/repo"}),
        ("codebuild", "StartBuild", {"projectName": "other-project"}),
        ("s3", "PutObject", {"Bucket": CHECKPOINT_BUCKET, "Key": "elsewhere/000000000001.json"}),
        ("s3", "GetObject", {"Bucket": CHECKPOINT_BUCKET, "Key": "elsewhere/x", "VersionId": "v"}),
        ("secretsmanager", "GetSecretValue", {"SecretId": "shiplift/other-key"}),
        ("secretsmanager", "GetSecretValue", {"SecretId": f"{SECRET}-extra"}),  # `??????` is six characters, not `*`
    ]
    assert len(denied_requests(config, outside)) == len(outside)
    assert not denied_requests(config, [("sagemaker", "DeleteEndpoint", {"EndpointName": "shiplift-qwen35-4b-semif-prod"})])


@pytest.mark.parametrize("key_ref, granted", [
    (SECRET, f"arn:aws:secretsmanager:us-east-1:123456789012:secret:{SECRET}-??????"),
    (f"arn:aws:secretsmanager:us-east-1:123456789012:secret:{SECRET}-AbC123",
     f"arn:aws:secretsmanager:us-east-1:123456789012:secret:{SECRET}-AbC123"),
    (f"arn:aws:secretsmanager:us-east-1:123456789012:secret:{SECRET}",  # a partial ARN: IAM sees the full one
     f"arn:aws:secretsmanager:us-east-1:123456789012:secret:{SECRET}-??????")])
def test_checkpoints_add_exactly_what_signing_and_verifying_send_on_their_bucket_prefix_and_secret(key_ref, granted):
    path = ROOT / "configs/releases/qwen35-4b-semif.yaml"
    plain = load_release_config(path, environ={})
    config = load_release_config(path, overrides=(checkpoints(key_ref, prefix="audit/ckpt"),), environ={})
    planned = plan_release(config, config_dir=path.parent)
    assert denied_requests(config, [(r.service, r.operation, r.params) for r in planned]) == []
    scope = Scope(config)
    needed = {pair for r in planned for pair in iam_request(scope, r.service, r.operation, r.params)
              if r.service == "secretsmanager" or r.params.get("Bucket") == CHECKPOINT_BUCKET}
    added = [s for s in pipeline_policy(config)["Statement"] if s not in pipeline_policy(plain)["Statement"]]
    assert {s["Sid"]: s["Resource"] for s in added} == {
        "CheckpointBucket": [f"arn:aws:s3:::{CHECKPOINT_BUCKET}"],
        "CheckpointObject": [f"arn:aws:s3:::{CHECKPOINT_BUCKET}/audit/ckpt/*"], "CheckpointKey": [granted]}
    assert {action for s in added for action in s["Action"]} == {action for action, _ in needed} == {
        "s3:ListBucket", "s3:GetBucketObjectLockConfiguration", "s3:ListBucketVersions", "s3:GetObjectVersion",
        "s3:PutObject", "s3:PutObjectRetention", "secretsmanager:GetSecretValue"}, "nothing the checkpoints do not send"
    granted_anywhere = {action for s in pipeline_policy(config)["Statement"] for action in s["Action"]}
    assert not {a for a in granted_anywhere if fnmatch.fnmatchcase(a, "s3:Delete*") or a == "s3:BypassGovernanceRetention"}


def test_every_call_of_a_real_release_is_in_the_table_and_allowed(aws, aws_calls, aws_release, tiny_release, tmp_path):
    """A release with checkpoints: every call allowed, and the checkpoint calls are the dry run's, in order."""
    aws_release.prepare_account(aws)
    _prepare(aws, secret=_pem(Ed25519PrivateKey.generate()))
    path = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state",
                                        backend__checkpoints={"key_ref": SECRET, "bucket": CHECKPOINT_BUCKET})
    config = load_release_config(path)
    planned = plan_release(config, config_dir=path.parent)
    assert run_release(path, progress=lambda message: None)["status"] == "promoted"
    assert {(service, operation) for service, operation, _ in aws_calls} <= set(OPERATIONS) | set(CHECKPOINT_OPERATIONS)
    assert denied_requests(config, aws_calls) == []
    fields = ("Bucket", "Key", "Prefix", "SecretId", "VersionId", "IfNoneMatch", "ChecksumAlgorithm", "ObjectLockMode")
    shape = lambda service, operation, params: (  # noqa: E731
        service, operation, {k: bool(params[k]) if k == "VersionId" else params[k] for k in fields if k in params})
    to_store = lambda service, params: service == "secretsmanager" or params.get("Bucket") == CHECKPOINT_BUCKET  # noqa: E731
    sent = [shape(*call) for call in aws_calls if to_store(call[0], call[2])]
    assert sent == [shape(r.service, r.operation, r.params) for r in planned if to_store(r.service, r.params)
                    and not (r.note or "").startswith("a later release")], "a fresh bucket: no stored version to read"
    assert all("ObjectLockRetainUntilDate" in params for _, operation, params in aws_calls
               if operation == "PutObject" and params["Bucket"] == CHECKPOINT_BUCKET)


def test_iam_command_writes_the_documents(tmp_path, capsys):
    assert main(["iam", str(ROOT / "configs/releases/mdeberta-nli.yaml"), "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["codebuild-policy.json", "codebuild-trust.json", "pipeline-policy.json", "sagemaker-execution-policy.json",
                     "sagemaker-execution-trust.json"]
    trust = json.loads((tmp_path / "sagemaker-execution-trust.json").read_text())
    assert trust["Statement"][0]["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert main(["iam", str(ROOT / "configs/releases/gemma-decision.yaml")]) == 2
    assert "uses the local backend" in capsys.readouterr().err
