"""The live suite's run (`tests/live/live_release.py`) against the AWS double, in the default suite: both releases
promoted as the generated roles, the second a canary of batch 1, and nothing named with the run prefix left afterwards,
also when a release fails or is interrupted; unconfirmed or unconfigured, nothing is created."""

from __future__ import annotations

import io
import json
import os
import signal
from types import SimpleNamespace

import pytest

from shiplift.tasks.backends.aws.iam import Scope, pipeline_policy
from shiplift.tasks.backends.aws.service_model import operation_name
from shiplift.tasks.backends.aws.session import Aws
from shiplift.tasks.errors import ConfigError, ShipliftError
from tests.aws.iam_reference import Account, actions_for, allowed, evaluated, sse_kms
from tests.live.live_release import MODEL_NAME, ROLES, LiveRelease, Pace

FAST = Pace(poll_s=0.05, wait_interval_s=2, check_interval_s=0.5, iam_deadline_s=10.0, cleanup_deadline_s=60.0)
QUIET = lambda message: None  # noqa: E731


@pytest.fixture
def account(aws, aws_release, monkeypatch):
    """The double with the bucket and repository an operator makes once, named to the live suite."""
    aws_release.prepare_account(aws)
    monkeypatch.setenv("SHIPLIFT_LIVE_BUCKET", aws_release.BUCKET)
    monkeypatch.setenv("SHIPLIFT_LIVE_ECR_REPOSITORY", aws_release.REPOSITORY)
    monkeypatch.delenv("SHIPLIFT_LIVE_OK", raising=False)
    return aws


def left_behind(double, bucket: str, prefix: str) -> dict[str, list[str]]:
    """Everything in the double named with the run prefix, by kind (empty lists when the run cleaned up)."""
    sagemaker = double.client("sagemaker")
    lists = {"endpoint": ("list_endpoints", "Endpoints", "EndpointName"),
             "endpoint-config": ("list_endpoint_configs", "EndpointConfigs", "EndpointConfigName"),
             "model": ("list_models", "Models", "ModelName"),
             "inference-component": ("list_inference_components", "InferenceComponents", "InferenceComponentName")}
    found = {kind: [item[field] for item in getattr(sagemaker, method)()[key] if item[field].startswith(prefix)]
             for kind, (method, key, field) in lists.items()}
    found["alarm"] = [a["AlarmName"]
                      for a in double.client("cloudwatch").describe_alarms(AlarmNamePrefix=prefix)["MetricAlarms"]]
    found["object"] = [o["Key"]
                       for o in double.client("s3").list_object_versions(Bucket=bucket, Prefix=prefix).get("Versions",
                                                                                                           [])]
    found["role"] = [r["RoleName"] for r in double.client("iam").list_roles()["Roles"]
                     if r["RoleName"].startswith(prefix)]
    found["project"] = [p for p in double.client("codebuild").list_projects()["projects"] if p.startswith(prefix)]
    return found


NOTHING = {kind: []
           for kind in ("endpoint", "endpoint-config", "model", "inference-component", "alarm", "object", "role",
                                 "project")}


def as_the_role(monkeypatch, run: LiveRelease) -> list[tuple[str, str, dict]]:
    """Every request the product's `Aws.call` sends with credentials other than the caller's: the releases' and the
    checks', as the pipeline role."""
    seen: list[tuple[str, str, dict]] = []
    send = Aws.call

    def spy(self, service, operation, **params):
        if self.access is not run.session:
            seen.append((service, operation_name(service, operation), params))
        return send(self, service, operation, **params)

    monkeypatch.setattr(Aws, "call", spy)
    return seen


def denied(config, requests) -> list[str]:
    """What the generated pipeline policy does not allow of `requests`, judged by the Service Authorization Reference
    (as tests/aws/test_iam.py judges a release's calls)."""
    scope, policy = Scope(config), pipeline_policy(config)
    account = Account(scope.partition, scope.region, scope.account)
    return [f"{service} {operation}: {need}" for service, operation, params in requests
            for need in [*(need for action in actions_for(service, operation, params)
                           for need in evaluated(account, service, operation, params, action)),
                         *sse_kms(account, service, operation, params)]
            if not allowed(policy, need)]


@pytest.mark.slow  # ~18 s: make test-slow; make test keeps the failure and interruption paths of the live run below
def test_the_live_run_releases_a_canary_as_the_generated_roles_and_leaves_nothing(account, aws_release, tmp_path,
                                                                                  monkeypatch):
    said: list[str] = []
    run = LiveRelease(tmp_path, yes=True, say=said.append, progress=QUIET, pace=FAST)
    requests = as_the_role(monkeypatch, run)
    seen_during: dict[str, list[str]] = {}
    check_second = run.check_second

    def look_then_check(first, second, pipeline):  # what existed while production served release 2
        seen_during.update(left_behind(account, aws_release.BUCKET, run.prefix))
        check_second(first, second, pipeline)

    run.check_second = look_then_check
    result = run.run()

    assert (result["first"]["status"], result["second"]["status"]) == ("promoted", "promoted")
    assert result["left"] == []
    assert sorted(seen_during["role"]) == sorted(f"{run.prefix}-{role}" for role in ROLES)
    assert seen_during["object"] and seen_during["project"] == [f"{run.prefix}-semif-image"]
    assert seen_during["inference-component"] == [result["second"]["component"]], "production, the candidates torn down"
    updates = [c.params for c in account.calls if c.operation == "UpdateInferenceComponent"]
    assert len(updates) == 1 and updates[0]["InferenceComponentName"] == result["first"]["component"]
    assert updates[0]["DeploymentConfig"]["RollingUpdatePolicy"]["MaximumBatchSize"] == {"Type": "COPY_COUNT",
                                                                                         "Value": 1}
    assert updates[0]["RuntimeConfig"]["CopyCount"] == 2
    creates = [c.params for c in account.calls if c.operation == "CreateEndpointConfig"]
    assert {pool["InstanceType"] for c in creates for pool in c["ProductionVariants"][0]["InstancePools"]} == {
        "ml.c6i.large", "ml.c5.large", "ml.m5.large"}
    assert any(m.startswith("[live] ESTIMATED cost of this run: at most about ") for m in said)
    operations = {operation for _, operation, _ in requests}
    assert {"AssumeRole", "CreateRole"}.isdisjoint(operations) and {"CreateEndpoint", "InvokeEndpoint"} <= operations
    assert denied(run.config, requests) == [], "every request made as the pipeline role is one its policy allows"
    assert left_behind(account, aws_release.BUCKET, run.prefix) == NOTHING


def test_a_release_that_fails_after_production_exists_still_leaves_nothing(account, aws_release, tmp_path, monkeypatch):
    """Production's component fails to start: the release fails, and production's endpoint, its failed component and
    everything before them are deleted by the run's cleanup (confirmed by SHIPLIFT_LIVE_OK=1 this time)."""
    monkeypatch.setenv("SHIPLIFT_LIVE_OK", "1")

    def progress(message: str) -> None:
        if message.endswith(" promote: started"):
            account.scenario(fail_next_component_with="The inference component's copies did not pass the ping health "
                                                      "check.")

    run = LiveRelease(tmp_path, say=QUIET, progress=progress, pace=FAST)
    with pytest.raises(ShipliftError, match="did not pass the ping health check"):
        run.run()
    production = f"{run.prefix}-{MODEL_NAME}-prod"
    assert any(c.operation == "CreateEndpoint" and c.params["EndpointName"] == production for c in account.calls)
    assert left_behind(account, aws_release.BUCKET, run.prefix) == NOTHING


def test_an_interrupted_run_cleans_up_and_says_what_it_could_not_delete(account, aws_release, tmp_path):
    """SIGTERM (a cancelled CI job; Ctrl-C raises the same KeyboardInterrupt) while the image builds, after someone
    attached a managed policy to the pipeline role: the interrupt goes on after the cleanup, which deleted everything
    else and names the role it could not delete, and why."""
    iam = account.client("iam")
    policy = iam.create_policy(PolicyName="someone-elses", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "s3:ListAllMyBuckets", "Resource": "*"}]}))
    said: list[str] = []

    def progress(message: str) -> None:
        if message.endswith(" image: started"):
            iam.attach_role_policy(RoleName=f"{run.prefix}-pipeline", PolicyArn=policy["Policy"]["Arn"])
            os.kill(os.getpid(), signal.SIGTERM)

    run = LiveRelease(tmp_path, yes=True, say=said.append, progress=progress, pace=FAST)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM received") as interrupted:
        run.run()
    assert signal.getsignal(signal.SIGTERM) is before, "the run's handler is gone with it"
    pipeline = f"{run.prefix}-pipeline"
    assert left_behind(account, aws_release.BUCKET, run.prefix) == {**NOTHING, "role": [pipeline]}
    assert [c for c in account.calls if c.mutating] == [], "nothing reached SageMaker"
    [note] = interrupted.value.__notes__
    assert note.startswith("the live run also left resources behind: role " + pipeline) and "detach" in note, note
    assert [m for m in said
            if m.startswith("[live] LEFT BEHIND: ")] == [f"[live] LEFT BEHIND: {note.split(': ', 1)[1]}"]
    assert f"[live] cleanup of {run.prefix}: 1 things left" in said


def test_a_role_that_is_not_assumable_yet_is_tried_again_until_a_deadline(tmp_path):
    not_yet = ConfigError("sts AssumeRole: AccessDenied: User x is not authorized to perform: sts:AssumeRole")
    answers = iter([not_yet, ConfigError("s3 HeadBucket: 403: Forbidden"), "assumed"])

    def attempt():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def raising(error: Exception):
        def fails():
            raise error
        return fails

    run = LiveRelease(tmp_path, say=QUIET, session_factory=lambda: None, pace=FAST)
    assert run.while_iam_propagates(attempt, "assume") == "assumed"
    with pytest.raises(ConfigError, match="InvalidClientTokenId"):  # other refusals are not waited out
        run.while_iam_propagates(raising(ConfigError("sts AssumeRole: InvalidClientTokenId: bad")), "assume")
    impatient = LiveRelease(tmp_path, say=QUIET, session_factory=lambda: None,
                            pace=Pace(poll_s=0.01, iam_deadline_s=0.05))
    with pytest.raises(ConfigError, match="AccessDenied"):
        impatient.while_iam_propagates(raising(not_yet), "assume")


class Terminal(io.StringIO):
    """Standard input that is a terminal, with what the person types."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stdin, prompted", [(io.StringIO("yes\n"), False), (Terminal("no\n"), True)],
                         ids=["not-a-terminal", "answered-no"])
def test_without_confirmation_nothing_is_created(account, aws_release, tmp_path, stdin, prompted):
    said: list[str] = []
    run = LiveRelease(tmp_path, say=said.append, stdin=stdin, pace=FAST)
    with pytest.raises(ConfigError) as refused:
        run.run()
    message = str(refused.value)
    assert "was not confirmed" in message and "--yes" in message and "SHIPLIFT_LIVE_OK=1" in message
    assert "ESTIMATED cost" in message and "ESTIMATED cost" in said[1], "the estimate is shown first"
    assert any(m.startswith("[live] type yes to create") for m in said) is prompted
    assert [c for c in account.calls if c.mutating] == []
    assert left_behind(account, aws_release.BUCKET, run.prefix) == NOTHING
    assert account.client("iam").list_roles()["Roles"] == []


def test_missing_settings_name_each_variable_and_how_to_create_it(aws, tmp_path, monkeypatch):
    for name in ("SHIPLIFT_LIVE_BUCKET", "SHIPLIFT_LIVE_ECR_REPOSITORY", "SHIPLIFT_LIVE_REGION"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as missing:
        LiveRelease(tmp_path, yes=True, say=QUIET, pace=FAST).run()
    message = str(missing.value)
    assert "SHIPLIFT_LIVE_BUCKET: an S3 bucket in us-east-1" in message and "aws s3 mb" in message
    assert "SHIPLIFT_LIVE_ECR_REPOSITORY" in message and "--image-tag-mutability IMMUTABLE" in message
    assert "SHIPLIFT_LIVE_REGION" not in message, "the region comes from the credential chain"
    assert aws.calls == []
    monkeypatch.setenv("SHIPLIFT_LIVE_BUCKET", "b")
    monkeypatch.setenv("SHIPLIFT_LIVE_ECR_REPOSITORY", "r")
    with pytest.raises(ConfigError, match="SHIPLIFT_LIVE_REGION: the region to release into"):
        LiveRelease(tmp_path, yes=True, say=QUIET, session_factory=lambda: SimpleNamespace(region_name=None)).run()
